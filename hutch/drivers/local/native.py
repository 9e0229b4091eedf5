"""Compile (once) and locate the ``hutch-nsexec`` helper.

The binary is cached as ``<dir>/hutch-nsexec-<source hash>``, so a changed source is
rebuilt and an unchanged one never is. Needs gcc, libc6-dev and libseccomp-dev. Built
twice: the first build prints the seccomp filter libseccomp compiles, the second embeds
that program, so no exec compiles it again.

    python -m hutch.drivers.local.native --out DIR     # prebuild, prints the path
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import os
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

from hutch.core.errors import DriverFailure

SOURCE = Path(__file__).parent / "native" / "hutch-nsexec.c"
HEADERS = (SOURCE.parent / "zygote.h", SOURCE.parent / "fileops.h")  # included by SOURCE
CFLAGS = ["-O2", "-Wall", "-Wextra", "-static"]
LIBS = ["-lseccomp"]


def helper_path(directory: Path) -> Path:
    # This file too: its build (the embedded seccomp program) is part of what the binary is.
    recipe = b"".join(f.read_bytes() for f in (SOURCE, *HEADERS)) + Path(__file__).read_bytes() + " ".join(CFLAGS + LIBS).encode()
    digest = hashlib.sha256(recipe).hexdigest()[:16]
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
        header = Path(tmp + ".seccomp.h")
        try:
            _compile(cc, tmp)
            header.write_text(seccomp_header(seccomp_program(Path(tmp))))
            _compile(cc, tmp, "-include", str(header))
            os.chmod(tmp, 0o755)
            os.rename(tmp, target)
        finally:
            for leftover in (Path(tmp), header):
                with contextlib.suppress(FileNotFoundError):
                    leftover.unlink()
    return target


def _compile(cc: str, out: str, *extra: str) -> None:
    proc = subprocess.run([cc, *CFLAGS, *extra, "-o", out, str(SOURCE), *LIBS],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise DriverFailure("building hutch-nsexec failed (is libseccomp-dev installed?):\n" + proc.stderr[-4000:])


def seccomp_program(helper: Path) -> bytes:
    """The sandbox's seccomp filter as libseccomp compiles it (``helper seccomp-bpf``): raw
    ``struct sock_filter`` instructions, 8 bytes each."""
    proc = subprocess.run([str(helper), "seccomp-bpf"], capture_output=True, check=False)
    if proc.returncode != 0 or not proc.stdout or len(proc.stdout) % 8:
        raise DriverFailure(f"hutch-nsexec seccomp-bpf failed (exit {proc.returncode}): "
                            + proc.stderr.decode(errors="replace")[-2000:])
    return proc.stdout


def seccomp_header(program: bytes) -> str:
    """``program`` as the C initializer the second build embeds (hutch-nsexec.c, install_seccomp)."""
    rows = []
    for (code, jt, jf, k) in struct.iter_unpack("=HBBI", program):
        rows.append(f"    {{0x{code:04x}, {jt}, {jf}, 0x{k:08x}}},")
    return "#define HUTCH_SECCOMP_PROG {\\\n" + "\\\n".join(rows) + "\\\n}\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hutch.drivers.local.native")
    parser.add_argument("--out", type=Path, required=True, help="directory for the binary (the driver uses <data_dir>/bin)")
    args = parser.parse_args(argv)
    print(ensure_helper(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
