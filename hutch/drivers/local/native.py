"""Compile (once) and locate the ``hutch-nsexec`` helper.

The binary is cached as ``<dir>/hutch-nsexec-<source hash>``, so a changed source is
rebuilt and an unchanged one never is. Needs gcc, libc6-dev and libseccomp-dev.

    python -m hutch.drivers.local.native --out DIR     # prebuild, prints the path
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from hutch.core.errors import DriverFailure

SOURCE = Path(__file__).parent / "native" / "hutch-nsexec.c"
CFLAGS = ["-O2", "-Wall", "-Wextra", "-static"]
LIBS = ["-lseccomp"]


def helper_path(directory: Path) -> Path:
    digest = hashlib.sha256(SOURCE.read_bytes() + " ".join(CFLAGS + LIBS).encode()).hexdigest()[:16]
    return directory / f"hutch-nsexec-{digest}"


def ensure_helper(directory: Path) -> Path:
    target = helper_path(directory)
    if target.exists():
        return target
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.exists():
            return target
        cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
        if cc is None:
            raise DriverFailure("the local driver needs gcc to build its helper (apt-get install gcc libc6-dev libseccomp-dev)")
        fd, tmp = tempfile.mkstemp(prefix=".hutch-nsexec-", dir=directory)
        os.close(fd)
        try:
            proc = subprocess.run([cc, *CFLAGS, "-o", tmp, str(SOURCE), *LIBS],
                                  capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                raise DriverFailure(
                    "building hutch-nsexec failed (is libseccomp-dev installed?):\n" + proc.stderr[-4000:])
            os.chmod(tmp, 0o755)
            os.rename(tmp, target)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hutch.drivers.local.native")
    parser.add_argument("--out", type=Path, required=True, help="directory for the binary (the driver uses <data_dir>/bin)")
    args = parser.parse_args(argv)
    print(ensure_helper(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
