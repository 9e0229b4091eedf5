"""Install layers: a runtime plus create-time ``dependencies`` (apt) and ``packages`` (npm),
built once per distinct request and shared, read-only, by every sandbox that asks for it.

A layer is the upper directory of one overlay over the runtime's root filesystem, filled
by ``apt-get install`` and ``npm install --global`` and then used as an extra lower layer
(``lowerdir=<layer>:<runtime>``) under each such sandbox's own writable layer. So a
sandbox that wants ``jq`` costs what ``jq`` costs once, and the next one starts as fast
as any other; ``<cache>/layers/<key>/tree`` with ``manifest.json`` (what apt installed,
which npm packages resolved to) beside it, keyed by the runtime build and the sorted
request. The cache is bounded and swept (layercache.py): a layer no sandbox is mounted over
goes after ``HUTCH_LAYER_RETENTION`` unused, or sooner, least recently used first, when the
layers take more than ``HUTCH_LAYER_CACHE_MAX``; one install larger than that is refused.

Who runs what: the install runs on the host as root, in a private mount namespace
(nothing stays mounted), chrooted into the overlay, with the host's network; ``/tmp``,
apt's lists and caches are tmpfs so they never land in the layer. That is the trust of
``hutch runtime build``, and it is only given to code that comes from the Debian
archive: apt and dpkg from the runtime, maintainer scripts of Debian packages. npm
packages are installed with ``--ignore-scripts``: their names come from the user, and
a package's install script must never run as root on the host (one that needs it can
be built inside a sandbox and snapshotted instead). Names are checked by
``core.packages`` (no leading ``-``, no shell characters) and passed as arguments,
never through a shell.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from hutch.core.errors import DriverFailure, InvalidInput, PayloadTooLarge
from hutch.core.runtimes import RuntimeRecipe
from hutch.drivers.local import layercache, rootfs

Log = Callable[[str], None]

# Run by ``unshare --mount``: mount the overlay, chroot, install. $1.. are the packages;
# everything else comes through the environment (never interpolated into the script).
_SCRIPT = r"""
set -eu
m=$MERGED
mount -t overlay overlay -o "lowerdir=$LOWER,upperdir=$UPPER,workdir=$WORK" "$m"
mount -t proc proc "$m/proc"
mount --rbind /dev "$m/dev"
mount -t tmpfs tmpfs "$m/tmp"
[ -e "$m/etc/resolv.conf" ] || : > "$m/etc/resolv.conf"
mount --bind /etc/resolv.conf "$m/etc/resolv.conf"
if [ -n "$DEPS" ]; then
  mkdir -p "$m/var/lib/apt/lists" "$m/var/cache/apt"
  mount -t tmpfs tmpfs "$m/var/lib/apt/lists"
  mount -t tmpfs tmpfs "$m/var/cache/apt"
  printf '#!/bin/sh\nexit 101\n' > "$m/usr/sbin/policy-rc.d"
  chmod 755 "$m/usr/sbin/policy-rc.d"
  apt="apt-get -q -o APT::Sandbox::User=root -o Acquire::Check-Valid-Until=false -o Dpkg::Use-Pty=0"
  echo "hutch-layer: apt-get update"
  chroot "$m" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive $apt update
  echo "hutch-layer: apt-get install $DEPS"
  # shellcheck disable=SC2086  # DEPS: checked names, one word each
  chroot "$m" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive \
    $apt install -y --no-install-recommends $DEPS
  rm -f "$m/usr/sbin/policy-rc.d"
  chroot "$m" dpkg-query -W -f '${binary:Package}=${Version}\n' > "$RESULT.apt"
fi
if [ -n "$PKGS" ]; then
  echo "hutch-layer: npm install --global --ignore-scripts $PKGS"
  # shellcheck disable=SC2086
  "$NPM" install --global --prefix "$m/usr/local" --ignore-scripts --omit=dev --loglevel=warn $PKGS
fi
"""


def layer_key(recipe: RuntimeRecipe, dependencies: Sequence[str], packages: Sequence[str]) -> str:
    doc = json.dumps({"runtime": rootfs.cache_key(recipe), "apt": sorted(dependencies), "npm": sorted(packages)},
                     sort_keys=True)
    return hashlib.sha256(doc.encode()).hexdigest()[:24]


def layer_path(cache: Path, key: str) -> Path:
    return cache / "layers" / key / "tree"


def lowers(cache: Path, recipe: RuntimeRecipe, layer: str | None) -> list[Path]:
    """The sandbox's read-only layers, top first."""
    base = rootfs.rootfs_path(cache, recipe)
    return [layer_path(cache, layer), base] if layer else [base]


def build(recipe: RuntimeRecipe, cache: Path, dependencies: Sequence[str], packages: Sequence[str], *,
          log: Log = lambda _m: None, max_bytes: int = layercache.DEFAULT_MAX_BYTES) -> str:
    """Build (or find) the layer; returns its key. Blocking: run it in a thread. A layer
    larger than the whole cache may be (``max_bytes``) is refused, naming the limit."""
    key = layer_key(recipe, dependencies, packages)
    root = cache / "layers"
    final = layer_path(cache, key)
    with rootfs.locked(root, key):
        if final.is_dir():
            layercache.touch(root, key)
            return key
        for stale in root.glob(f".tmp-{key}-*"):  # a build that died; we hold the lock
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{key}-", dir=root))
        try:
            started = time.monotonic()
            _install(recipe, cache, tmp, dependencies, packages, log)
            manifest = {"runtime": recipe.name, "runtime_key": rootfs.cache_key(recipe),
                        "dependencies": list(dependencies), "packages": list(packages),
                        "build_seconds": round(time.monotonic() - started, 1)}
            apt_list = tmp / "result.apt"
            if apt_list.exists():
                manifest["apt"] = apt_list.read_text().split()
                apt_list.unlink()
            npm_root = tmp / "upper/usr/local/lib/node_modules"
            manifest["npm"] = _npm_versions(npm_root)
            _check_installed(manifest, dependencies, packages)
            size = layercache.tree_bytes(tmp / "upper")
            if size > max_bytes:
                field = "packages" if packages else "dependencies"
                raise PayloadTooLarge(
                    f"{field}: the install takes {size >> 20} MiB, more than this server keeps for all install "
                    f"layers (HUTCH_LAYER_CACHE_MAX, {max_bytes >> 20} MiB)", field=field)
            (tmp / "size").write_text(f"{size}\n")
            for scratch in ("work", "merged"):
                shutil.rmtree(tmp / scratch, ignore_errors=True)
            (tmp / "upper").rename(tmp / "tree")
            (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
            (tmp / "used").touch()
            os.rename(tmp, final.parent)
            log(f"layer {key}: built in {manifest['build_seconds']}s")
            return key
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)  # the overlay went with its mount namespace
            raise


def _install(recipe: RuntimeRecipe, cache: Path, tmp: Path, dependencies: Sequence[str], packages: Sequence[str],
             log: Log) -> None:
    upper, work, merged = tmp / "upper", tmp / "work", tmp / "merged"
    for d in (upper, work, merged):
        d.mkdir()
    npm = shutil.which("npm") or ""
    if packages and not npm:
        raise DriverFailure("packages: this host has no npm to install them with (apt-get install npm)")
    env = {
        **os.environ,  # the host's npm settings (CA file, proxy); apt in the chroot gets a clean env
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LOWER": str(rootfs.rootfs_path(cache, recipe)),
        "UPPER": str(upper), "WORK": str(work), "MERGED": str(merged), "RESULT": str(tmp / "result"),
        "DEPS": " ".join(dependencies), "PKGS": " ".join(packages), "NPM": npm, "HOME": str(tmp),
        "npm_config_cache": str(cache / ".npm"), "npm_config_update_notifier": "false", "npm_config_fund": "false",
        "npm_config_audit": "false",
        "npm_config_registry": os.environ.get("HUTCH_NPM_REGISTRY", "https://registry.npmjs.org/"),
    }
    if npm:
        env["PATH"] = f"{Path(npm).parent}:{env['PATH']}"  # the host's node for the host's npm
        # --prefix moves npm's global config into the tree: name the host's own.
        globalconfig = subprocess.run([npm, "config", "get", "globalconfig"], capture_output=True,
                                      text=True).stdout.strip()
        if globalconfig:
            env["npm_config_globalconfig"] = globalconfig
    proc = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", _SCRIPT, "hutch-layer"],
                          env=env, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=1800)
    for line in proc.stdout.splitlines()[-200:]:
        log(line)
    if proc.returncode != 0:
        raise _failure(proc.stdout, dependencies, packages)


_APT_MISSING = re.compile(r"E: (Unable to locate package \S+|Version '[^']+' for '[^']+' was not found"
                          r"|Package '?\S+'? has no installation candidate)")
_NPM_MISSING = re.compile(r"npm (?:ERR!|error) (?:code (E404|ETARGET)|404 .*|notarget .*)")


def _failure(output: str, dependencies: Sequence[str], packages: Sequence[str]) -> Exception:
    """The user's mistake (no such package or version) is a 400 naming it; anything else
    (no network, a broken mirror) is the server's problem, with the tool's own words."""
    tail = "\n".join(output.strip().splitlines()[-15:])
    if dependencies and (found := _APT_MISSING.findall(output)):
        return InvalidInput(f"dependencies: apt cannot install {', '.join(dependencies)}: {'; '.join(found)}",
                            field="dependencies")
    if packages and _NPM_MISSING.search(output):
        lines = [x for x in output.splitlines() if "404" in x or "notarget" in x or "No matching version" in x]
        return InvalidInput(f"packages: npm cannot install {', '.join(packages)}: "
                            f"{' '.join(lines[:3]) or tail}", field="packages")
    field = "dependencies" if dependencies and "apt-get" in tail else "packages"
    return DriverFailure(f"{field}: installing failed:\n{tail}", field=field)


def _npm_versions(modules: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    if not modules.is_dir():
        return out
    for entry in sorted(modules.iterdir()):
        dirs = sorted(entry.iterdir()) if entry.name.startswith("@") and entry.is_dir() else [entry]
        for d in dirs:
            with contextlib.suppress(OSError, ValueError):
                data = json.loads((d / "package.json").read_text())
                out[data["name"]] = data["version"]
    return out


def _check_installed(manifest: dict[str, Any], dependencies: Sequence[str], packages: Sequence[str]) -> None:
    have_apt = {line.partition("=")[0].partition(":")[0] for line in manifest.get("apt", [])}
    for dep in dependencies:
        name = dep.partition("=")[0].partition(":")[0]
        if name not in have_apt:
            raise DriverFailure(f"dependencies: {dep} is not installed after apt-get install", field="dependencies")
    for pkg in packages:  # registry specs only (core.packages): name[@version], @scope/name[@version]
        name = "@" + pkg[1:].partition("@")[0] if pkg.startswith("@") else pkg.partition("@")[0]
        if name not in manifest.get("npm", {}):
            raise DriverFailure(f"packages: {pkg} is not installed after npm install", field="packages")


def find_in_lowers(layers: Sequence[Path], rel: str) -> Path:
    """``rel`` (e.g. etc/passwd) as the overlay shows it: from the topmost layer that has it."""
    for layer in layers:
        candidate = layer / rel
        if candidate.exists():
            return candidate
    return layers[-1] / rel
