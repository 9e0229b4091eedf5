"""Runtime root filesystems for the local driver, built from catalog recipes with mmdebstrap.

Layout: ``<cache>/<name>-<recipe_hash>/rootfs`` with ``manifest.json`` beside it (every
Debian package, npm package and wheel that went in, at the version it resolved to, and
what the version command printed). A build happens in a temporary sibling directory and
is renamed into place when complete, so a half-built tree is never used, and an flock per
key keeps two processes from building the same runtime at once. The directory's
existence is the "built" marker.

Steps, in order: mmdebstrap (Debian suite + packages), ``npm install --global`` with the
host's npm into ``<rootfs>/usr/local`` (pinned versions), the executables of pinned PyPI
wheels into ``/usr/local/bin``, symlinks, hutch's own files (home, workspace, hosts), then
the recipe's version command is run in the tree (no network) and must print its promise.

The tree is shared: every sandbox of a runtime mounts it read-only as the lower layer of
an overlay and writes to its own upper layer, so N sandboxes cost one copy.

CLI (``hutch runtime build`` is the same with a progress display)::

    python -m hutch.drivers.local.rootfs build base:latest [--cache DIR]
    python -m hutch.drivers.local.rootfs build --all
    python -m hutch.drivers.local.rootfs list
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from hutch.core import runtimes
from hutch.core.errors import DriverFailure, RuntimeNotFound
from hutch.core.runtimes import RuntimeRecipe, runtime_file

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
    hint = f"hutch runtime build {name}"
    return hint if cache == default_cache() else f"{hint} --cache {cache}"


def manifest_path(cache: Path, recipe: RuntimeRecipe) -> Path:
    return cache / cache_key(recipe) / "manifest.json"


def read_manifest(cache: Path, recipe: RuntimeRecipe) -> dict[str, Any] | None:
    # info.json: what builders before the manifest wrote (same hash, same tree, fewer facts).
    for path in (manifest_path(cache, recipe), manifest_path(cache, recipe).with_name("info.json")):
        with contextlib.suppress(OSError, ValueError):
            return json.loads(path.read_text())
    return None


def build_info(cache: Path, recipe: RuntimeRecipe) -> dict[str, object]:
    """Size and build time of a built runtime, from its manifest (``{}`` when not built)."""
    manifest = read_manifest(cache, recipe) if is_built(cache, recipe) else None
    if not manifest:
        return {}
    built = manifest.get("built_at")
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(built)) if isinstance(built, (int, float)) else None
    return {"sizeBytes": manifest.get("bytes"), "builtAt": when, "buildSeconds": manifest.get("build_seconds")}


def built_rootfs(name: str, cache: Path | None = None) -> Path:
    """The built root filesystem of runtime ``name`` (a name or srt_ id), for packers such
    as the Nomad driver's OCI images. Raises RuntimeNotFound, saying how to build it."""
    cache = cache or default_cache()
    recipe = lookup(name)
    if not is_built(cache, recipe):
        raise RuntimeNotFound(f"runtime {recipe.name} is not built on this host; build it with: "
                              f"{build_hint(recipe.name, cache)}", field="runtime")
    return rootfs_path(cache, recipe)


def lookup(name: str) -> RuntimeRecipe:
    recipe = runtimes.find(name)
    if recipe is None:
        known = ", ".join(r.name for r in runtimes.CATALOG)
        raise RuntimeNotFound(f"unknown runtime {name!r} (known: {known})", field="runtime")
    return recipe


@contextlib.contextmanager
def locked(cache: Path, key: str) -> Iterator[None]:
    """An exclusive lock on building ``key`` in ``cache`` (across processes)."""
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
    with locked(cache, key):
        if final.is_dir() and not force:
            _readable(final.parent)
            log(f"{recipe.name}: cached at {final}")
            return final
        for stale in cache.glob(f".tmp-{key}-*"):  # left by a build that died; we hold the lock
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{key}-", dir=cache))
        root = tmp / "rootfs"
        try:
            started = time.monotonic()
            steps = _steps(recipe)
            manifest: dict[str, Any] = {"name": recipe.name, "id": recipe.id, "recipe_hash": recipe.recipe_hash,
                              "suite": recipe.suite, "packages": list(recipe.packages),
                              "npm_packages": list(recipe.npm_packages), "pypi_tools": list(recipe.pypi_tools),
                              "files": [list(pair) for pair in recipe.files],
                              "links": [list(pair) for pair in recipe.links]}
            for n, (label, step) in enumerate(steps, 1):
                log(f"{recipe.name}: [{n}/{len(steps)}] {label} ({time.monotonic() - started:.0f}s)")
                step(recipe, root, cache, tmp, manifest, log)
            took = time.monotonic() - started
            size = _du(root)
            manifest.update(build_seconds=round(took, 1), bytes=size, built_at=time.time())
            (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
            if final.parent.exists():  # only with force: replace the old build
                shutil.rmtree(final.parent)
            _readable(tmp)
            os.rename(tmp, final.parent)
            log(f"{recipe.name}: built in {took:.1f}s, {size / 2**20:.0f} MiB at {final}")
            return final
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise


def _readable(runtime_dir: Path) -> None:
    """mkdtemp makes the runtime's directory 0700; a server that is not root (the local
    driver's rootless mode) must be able to use it as a read-only layer. Its contents
    are public Debian packages; the rootfs keeps its own modes inside."""
    with contextlib.suppress(PermissionError):
        os.chmod(runtime_dir, 0o755)


Step = Callable[[RuntimeRecipe, Path, Path, Path, dict[str, Any], Log], None]


def _steps(recipe: RuntimeRecipe) -> list[tuple[str, Step]]:
    steps: list[tuple[str, Step]] = [(f"debian {recipe.suite}: {len(recipe.packages)} packages", _debian)]
    if recipe.npm_packages:
        steps.append(("npm: " + " ".join(recipe.npm_packages), _npm))
    if recipe.pypi_tools:
        steps.append(("pypi: " + " ".join(recipe.pypi_tools), _pypi_tools))
    if recipe.pypi_packages:
        steps.append(("pypi libraries: " + " ".join(recipe.pypi_packages), _pypi_packages))
    steps.append(("links and hutch files", _finish))
    steps.append(("version check: " + " ".join(recipe.version_command), _version_check))
    return steps


def _debian(recipe: RuntimeRecipe, root: Path, _cache: Path, _tmp: Path, manifest: dict[str, Any], log: Log) -> None:
    _mmdebstrap(recipe, root, log)
    out = subprocess.run(["dpkg-query", f"--admindir={root}/var/lib/dpkg", "-W", "-f", "${Package}\t${Version}\n"],
                         capture_output=True, text=True, check=True).stdout
    manifest["debian"] = dict(line.split("\t", 1) for line in out.splitlines() if "\t" in line)


def _run(cmd: list[str], what: str, log: Log, *, env: dict[str, str] | None = None, cwd: Path | None = None) -> None:
    log(f"  $ {' '.join(cmd)}")
    tail: list[str] = []
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=cwd) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip()
            tail = [*tail[-30:], line]
            log(f"  {line}")
    if proc.returncode != 0:
        raise DriverFailure(f"{what} failed (exit {proc.returncode}):\n" + "\n".join(tail))


def _npm(recipe: RuntimeRecipe, root: Path, cache: Path, tmp: Path, manifest: dict[str, Any], log: Log) -> None:
    npm = shutil.which("npm")
    if npm is None:
        raise DriverFailure(f"runtime {recipe.name} installs npm packages and this host has no npm "
                            "(apt-get install npm)")
    prefix = root / "usr/local"
    # --prefix moves npm's global config into the tree, so name the host's own (its CA file,
    # proxy); the registry is set explicitly so no npmrc can point a runtime elsewhere.
    globalconfig = subprocess.run([npm, "config", "get", "globalconfig"], capture_output=True, text=True).stdout.strip()
    env = {**os.environ, "npm_config_cache": str(cache / ".npm"), "npm_config_update_notifier": "false",
           "npm_config_fund": "false", "npm_config_audit": "false",
           "npm_config_registry": os.environ.get("HUTCH_NPM_REGISTRY", "https://registry.npmjs.org/")}
    if globalconfig:
        env["npm_config_globalconfig"] = globalconfig
    _run([npm, "install", "--global", "--prefix", str(prefix), "--omit=dev", "--loglevel=warn",
          *recipe.npm_packages], f"runtime {recipe.name}: npm install", log, env=env, cwd=tmp)
    resolved: dict[str, str] = {}
    modules = prefix / "lib/node_modules"
    for pkg_json in sorted(modules.glob("**/package.json")):
        rel = pkg_json.parent.relative_to(modules)
        parts = rel.parts
        # A package dir is <name> or @scope/<name>, possibly nested under node_modules/.
        if len(parts) >= 2 and parts[-2].startswith("@"):
            name, parent = "/".join(parts[-2:]), parts[:-2]
        else:
            name, parent = parts[-1], parts[:-1]
        if parent and parent[-1] != "node_modules":
            continue
        with contextlib.suppress(OSError, ValueError):
            data = json.loads(pkg_json.read_text())
            if data.get("name") == name and "version" in data:
                resolved[str(rel)] = data["version"]
    manifest["npm"] = resolved


def _wheel_platform() -> str:
    machine = os.uname().machine
    return f"manylinux_2_17_{machine}"


def _pypi_tools(recipe: RuntimeRecipe, root: Path, _cache: Path, tmp: Path, manifest: dict[str, Any], log: Log) -> None:
    dest = tmp / "wheels"
    dest.mkdir()
    _run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--platform", _wheel_platform(),
          "--disable-pip-version-check", "--dest", str(dest), *recipe.pypi_tools],
         f"runtime {recipe.name}: pip download", log)
    bindir = root / "usr/local/bin"
    bindir.mkdir(parents=True, exist_ok=True)
    wheels = []
    for wheel in sorted(dest.glob("*.whl")):
        installed = []
        with zipfile.ZipFile(wheel) as zf:
            for info in zf.infolist():
                parts = info.filename.split("/")
                # Only the executables a wheel ships as scripts: no site-packages, no Python involved.
                if len(parts) == 3 and parts[0].endswith(".data") and parts[1] == "scripts" and parts[2]:
                    target = bindir / parts[2]
                    with zf.open(info) as src, open(target, "wb") as out:
                        shutil.copyfileobj(src, out)
                    target.chmod(0o755)
                    installed.append(f"/usr/local/bin/{parts[2]}")
        if not installed:
            raise DriverFailure(f"runtime {recipe.name}: wheel {wheel.name} ships no executables")
        wheels.append({"wheel": wheel.name, "sha256": hashlib.sha256(wheel.read_bytes()).hexdigest(),
                       "installed": installed})
    shutil.rmtree(dest)
    manifest["pypi"] = wheels


def _pypi_packages(recipe: RuntimeRecipe, root: Path, _cache: Path, tmp: Path, manifest: dict[str, Any],
                   log: Log) -> None:
    """The pinned libraries and their dependencies, resolved by the host's pip for the tree's
    python (wheels only: nothing is compiled, and no code of theirs runs on the host)."""
    if not recipe.python:
        raise DriverFailure(f"runtime {recipe.name}: pypi_packages needs the tree's python version (python=)")
    site = root / f"usr/local/lib/python{recipe.python}/dist-packages"  # on Debian's python3 path
    report = tmp / "pip-report.json"
    # Every manylinux tag up to trixie's glibc (2.41) named: pip 23 does not expand a given
    # manylinux_2_39 to the older tags (matplotlib ships manylinux_2_17 wheels only).
    machine = os.uname().machine
    platforms = [arg for minor in range(39, 16, -1) for arg in ("--platform", f"manylinux_2_{minor}_{machine}")]
    _run([sys.executable, "-m", "pip", "install", "--target", str(site), "--only-binary=:all:", "--no-compile",
          # The host's own packages are not the tree's: their conflicts would only be noise.
          "--no-warn-conflicts", *platforms, "--python-version", recipe.python,
          "--implementation", "cp", "--disable-pip-version-check", "--report", str(report),
          *recipe.pypi_packages], f"runtime {recipe.name}: pip install", log)
    installed = json.loads(report.read_text()).get("install", [])
    manifest["pypi_packages"] = {item["metadata"]["name"]: item["metadata"]["version"] for item in installed}
    # Bytecode by the tree's own python, once, in the tree: otherwise every sandbox compiles
    # pandas and matplotlib again at its first import (seconds each).
    _in_tree(recipe, root, ["python3", "-m", "compileall", "-q", "-j", "0",
                            f"/usr/local/lib/python{recipe.python}/dist-packages"], "compileall")


def _in_tree(recipe: RuntimeRecipe, root: Path, argv: list[str], what: str) -> str:
    """Run ``argv`` in the tree: private namespaces, its own /proc, no network, tmpfs HOME."""
    script = ('mount -t tmpfs -o size=64m,mode=1777 hutch-check "$1/tmp" && root="$1" && shift && '
              'exec chroot "$root" /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin '
              'HOME=/tmp LANG=C.UTF-8 "$@"')
    cmd = ["unshare", "--mount", "--propagation=private", "--pid", "--net", "--fork", f"--mount-proc={root}/proc",
           "/bin/sh", "-c", script, "sh", str(root), *argv]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired as err:
        raise DriverFailure(f"runtime {recipe.name}: {what} did not finish in 600s") from err
    if proc.returncode != 0:
        raise DriverFailure(f"runtime {recipe.name}: {what} failed (exit {proc.returncode}): "
                            f"{(proc.stdout + proc.stderr).strip()[-500:]}")
    return proc.stdout


def _finish(recipe: RuntimeRecipe, root: Path, _cache: Path, _tmp: Path, _manifest: dict[str, Any], _log: Log) -> None:
    for file_path, name in recipe.files:
        program = root / file_path.lstrip("/")
        program.parent.mkdir(parents=True, exist_ok=True)
        program.write_bytes(runtime_file(name))
        program.chmod(0o755)
    for link, target in recipe.links:
        path = root / link.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.is_symlink() or path.exists():
            path.unlink()
        path.symlink_to(target)
    _customize(root)


def _version_check(recipe: RuntimeRecipe, root: Path, _cache: Path, _tmp: Path, manifest: dict[str, Any], log: Log) -> None:
    # In the tree, in private namespaces: its own /proc, no network, and a tmpfs over /tmp as
    # HOME, so the check writes nothing into the tree (it may be a cached, shared one).
    script = ('mount -t tmpfs -o size=64m,mode=1777 hutch-check "$1/tmp" && root="$1" && shift && '
              'exec chroot "$root" /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin '
              'HOME=/tmp LANG=C.UTF-8 "$@"')
    cmd = ["unshare", "--mount", "--propagation=private", "--pid", "--net", "--fork", f"--mount-proc={root}/proc",
           "/bin/sh", "-c", script, "sh", str(root), *recipe.version_command]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired as err:
        raise DriverFailure(f"runtime {recipe.name}: {' '.join(recipe.version_command)} did not finish in 120s") from err
    output = (proc.stdout + proc.stderr).strip()
    log(f"  {output}")
    if proc.returncode != 0 or recipe.version_expect not in output:
        raise DriverFailure(f"runtime {recipe.name}: {' '.join(recipe.version_command)} printed {output!r} "
                            f"(exit {proc.returncode}); expected {recipe.version_expect!r}")
    manifest["version_output"] = output


def _mmdebstrap(recipe: RuntimeRecipe, target: Path, log: Log) -> None:
    mirror = os.environ.get("HUTCH_DEBIAN_MIRROR", DEFAULT_MIRROR)
    # Valid-Until is not checked: signatures still are, and a frozen mirror (snapshot.debian.org,
    # or a pinned local mirror) is exactly what a reproducible build wants; sid's Release expires in a week.
    cmd = ["mmdebstrap", "--variant=minbase", "--aptopt=Acquire::Check-Valid-Until \"false\"",
           "--include=" + ",".join(recipe.packages), recipe.suite, str(target), mirror]
    if shutil.which("mmdebstrap") is None:
        raise DriverFailure("mmdebstrap is not installed (apt-get install mmdebstrap)")
    _run(cmd, f"building runtime {recipe.name} (mmdebstrap)", log)


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
    parser = argparse.ArgumentParser(prog="python -m hutch.drivers.local.rootfs",
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
