"""Runtime root filesystems for the local driver, built from catalog recipes with mmdebstrap.

Layout: ``<cache>/<name>-<recipe_hash>/rootfs``. A build happens in a temporary sibling
directory and is renamed into place when complete, so a half-built tree is never used,
and an flock per key keeps two processes from building the same runtime at once. The
directory's existence is the "built" marker.

CLI (for CI scripts that prebuild)::

    python -m drivers.local.rootfs build base:latest [--cache DIR]
    python -m drivers.local.rootfs build --all
    python -m drivers.local.rootfs list
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from core import runtimes
from core.errors import DriverFailure, RuntimeNotFound
from core.runtimes import RuntimeRecipe

DEFAULT_CACHE = Path("/var/cache/hutch/runtimes")
DEFAULT_MIRROR = "http://deb.debian.org/debian"
SANDBOX_USER = "agentuity"
SANDBOX_HOME = "/home/agentuity"
WORKSPACE = "/workspace"

Log = Callable[[str], None]


def default_cache() -> Path:
    return Path(os.environ.get("HUTCH_RUNTIME_CACHE") or DEFAULT_CACHE)


def cache_key(recipe: RuntimeRecipe) -> str:
    return f"{re.sub(r'[^A-Za-z0-9._-]', '_', recipe.name)}-{recipe.recipe_hash}"


def rootfs_path(cache: Path, recipe: RuntimeRecipe) -> Path:
    return cache / cache_key(recipe) / "rootfs"


def is_built(cache: Path, recipe: RuntimeRecipe) -> bool:
    return rootfs_path(cache, recipe).is_dir()


def build_hint(name: str, cache: Path) -> str:
    return f"python -m drivers.local.rootfs build {name} --cache {cache}"


def lookup(name: str) -> RuntimeRecipe:
    recipe = runtimes.find(name)
    if recipe is None:
        known = ", ".join(r.name for r in runtimes.CATALOG)
        raise RuntimeNotFound(f"unknown runtime {name!r} (known: {known})", field="runtime")
    return recipe


@contextlib.contextmanager
def _locked(cache: Path, key: str) -> Iterator[None]:
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / f".{key}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def build(recipe: RuntimeRecipe, cache: Path, *, log: Log = print, force: bool = False) -> Path:
    """Build ``recipe`` into ``cache`` unless it is already there. Returns the rootfs path."""
    final = rootfs_path(cache, recipe)
    key = cache_key(recipe)
    with _locked(cache, key):
        if final.is_dir() and not force:
            log(f"{recipe.name}: cached at {final}")
            return final
        for stale in cache.glob(f".tmp-{key}-*"):  # left by a build that died; we hold the lock
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{key}-", dir=cache))
        try:
            started = time.monotonic()
            _mmdebstrap(recipe, tmp / "rootfs", log)
            _customize(tmp / "rootfs")
            took = time.monotonic() - started
            size = _du(tmp / "rootfs")
            (tmp / "info.json").write_text(
                json.dumps({"name": recipe.name, "recipe_hash": recipe.recipe_hash,
                            "suite": recipe.suite, "packages": list(recipe.packages),
                            "build_seconds": round(took, 1), "bytes": size, "built_at": time.time()},
                           indent=2)
            )
            if final.parent.exists():  # only with force: replace the old build
                shutil.rmtree(final.parent)
            os.rename(tmp, final.parent)
            log(f"{recipe.name}: built in {took:.1f}s, {size / 2**20:.0f} MiB at {final}")
            return final
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise


def _mmdebstrap(recipe: RuntimeRecipe, target: Path, log: Log) -> None:
    mirror = os.environ.get("HUTCH_DEBIAN_MIRROR", DEFAULT_MIRROR)
    cmd = ["mmdebstrap", "--variant=minbase", "--include=" + ",".join(recipe.packages),
           recipe.suite, str(target), mirror]
    if shutil.which("mmdebstrap") is None:
        raise DriverFailure("mmdebstrap is not installed (apt-get install mmdebstrap)")
    log(f"{recipe.name}: {' '.join(cmd)}")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    tail: list[str] = []
    for line in proc.stdout:
        line = line.rstrip()
        tail = [*tail[-30:], line]
        log(f"  {line}")
    if proc.wait() != 0:
        raise DriverFailure(f"building runtime {recipe.name} failed:\n" + "\n".join(tail))


def _customize(root: Path) -> None:
    if root.resolve() == Path("/"):
        raise DriverFailure("refusing to customize the host root as a runtime")
    for d in (root / SANDBOX_HOME.lstrip("/"), root / WORKSPACE.lstrip("/")):
        d.mkdir(parents=True, exist_ok=True)
        d.chmod(0o755)
    (root / "tmp").chmod(0o1777)
    # The build host's files must not leak into every sandbox.
    resolv = root / "etc/resolv.conf"
    if resolv.exists() or resolv.is_symlink():
        resolv.unlink()
    resolv.write_text("")
    (root / "etc/hostname").write_text("sandbox\n")
    (root / "etc/hosts").write_text("127.0.0.1\tlocalhost sandbox\n::1\tlocalhost ip6-localhost ip6-loopback\n")


def _du(path: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m drivers.local.rootfs",
                                     description="Build runtime root filesystems for the local driver.")
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build runtimes (no-op when cached)")
    b.add_argument("names", nargs="*", help="catalog names, e.g. base:latest python:3.13")
    b.add_argument("--all", action="store_true", help="every runtime in the catalog")
    b.add_argument("--force", action="store_true", help="rebuild even when cached")
    b.add_argument("--cache", type=Path, default=None, help=f"cache dir (default $HUTCH_RUNTIME_CACHE or {DEFAULT_CACHE})")
    ls = sub.add_parser("list", help="show catalog runtimes and whether they are built")
    ls.add_argument("--cache", type=Path, default=None)
    args = parser.parse_args(argv)
    cache = args.cache or default_cache()
    if args.command == "list":
        for recipe in runtimes.CATALOG:
            state = "built" if is_built(cache, recipe) else "missing"
            print(f"{recipe.name:20} {state:8} {rootfs_path(cache, recipe)}")
        return 0
    if args.all:
        recipes = list(runtimes.CATALOG)
    elif args.names:
        try:
            recipes = [lookup(n) for n in args.names]
        except RuntimeNotFound as err:
            parser.error(err.message)
    else:
        parser.error("name a runtime or pass --all")

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    for recipe in recipes:
        build(recipe, cache, log=log, force=args.force)
    return 0


if __name__ == "__main__":
    sys.exit(main())
