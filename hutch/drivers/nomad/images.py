"""Runtime images for the nomad driver: the local driver's root filesystems as OCI images.

A runtime name means the same thing under both drivers: the image is the rootfs that
``drivers.local.rootfs`` builds from the catalog recipe (one layer), plus a small layer
with the sandbox user (``agentuity``, uid ``SANDBOX_UID``) and its home and workspace.
umoci builds the OCI layout, skopeo pushes it to the registry. The tag carries the
recipe hash and this module's format, so a changed recipe is a new image and an
unchanged one is never pushed twice.

CLI (used by ``scripts/services.d/nomad.sh``)::

    python -m hutch.drivers.nomad.images ref base:latest --registry 127.0.0.1:5000
    python -m hutch.drivers.nomad.images exists base:latest --registry 127.0.0.1:5000   # exit 0/1
    python -m hutch.drivers.nomad.images push base:latest --registry 127.0.0.1:5000
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from hutch.core.errors import DriverFailure
from hutch.core.runtimes import RuntimeRecipe
from hutch.drivers import trust
from hutch.drivers.local import layers, rootfs

FORMAT = 2  # bump when the image layout below changes (2: the execute-only init shell)
# pid 1's shell: a copy of the runtime's dash that the sandbox user may run but not read. The
# kernel makes a process running an unreadable program non-dumpable, so no process of the
# sandbox can ptrace pid 1 or open its /proc/1/mem (the local driver's hutch-init does the
# same with prctl(PR_SET_DUMPABLE)).
INIT_SHELL = "/usr/lib/hutch/init-sh"
# Every nomad sandbox runs as this host uid: unprivileged, outside the local driver's range
# (200000..259999) and outside the usual /etc/subuid ranges.
SANDBOX_UID = int(os.environ.get("HUTCH_NOMAD_UID", "290000"))
HOME = rootfs.SANDBOX_HOME
USER = rootfs.SANDBOX_USER


def image_ref(recipe: RuntimeRecipe, registry: str, layer: str | None = None) -> str:
    """``layer``: an install layer's key (drivers/local/layers.py): the runtime plus it."""
    repo, _, version = recipe.name.partition(":")
    repo = re.sub(r"[^a-z0-9._-]", "-", repo.lower())
    version = re.sub(r"[^A-Za-z0-9._-]", "-", version or "latest")
    suffix = f"-l{layer[:16]}" if layer else ""
    if (certs := trust.extra_certs()) is not None:  # the operator's CAs are in the image's bundle
        suffix += f"-c{hashlib.sha256(certs).hexdigest()[:12]}"
    return f"{registry}/hutch/{repo}:{version}-{recipe.recipe_hash[:12]}-f{FORMAT}{suffix}"


def exists(recipe: RuntimeRecipe, registry: str, layer: str | None = None) -> bool:
    """Whether the registry has the image (a HEAD on its manifest)."""
    ref = image_ref(recipe, registry, layer)
    host, _, rest = ref.partition("/")
    name, _, tag = rest.rpartition(":")
    req = urllib.request.Request(
        f"http://{host}/v2/{name}/manifests/{tag}", method="HEAD",
        headers={"Accept": "application/vnd.oci.image.manifest.v1+json, "
                           "application/vnd.docker.distribution.manifest.v2+json"})
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status == 200
    except urllib.error.HTTPError as err:
        if err.code == 404:
            return False
        raise DriverFailure(f"registry {registry}: HTTP {err.code} for {ref}") from err
    except OSError as err:
        raise DriverFailure(f"registry {registry} does not answer: {err}") from err


def _run(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise DriverFailure(f"{' '.join(cmd[:3])} failed: {proc.stderr.strip()[-2000:]}")


def _stage_user_layer(roots: list[Path], stage: Path) -> None:
    """/etc/passwd and /etc/group with the sandbox user; its home and /workspace, owned by it.
    ``roots``: the layers below, top first (an install layer may have added users)."""
    def below(rel: str) -> Path:
        return layers.find_in_lowers(roots, rel)

    etc = stage / "etc"
    etc.mkdir(parents=True)
    st = os.stat(below("etc"))
    os.chmod(etc, st.st_mode & 0o7777)
    passwd = below("etc/passwd").read_text()
    group = below("etc/group").read_text()
    (etc / "passwd").write_text(passwd + f"{USER}:x:{SANDBOX_UID}:{SANDBOX_UID}:{USER}:{HOME}:/bin/bash\n")
    (etc / "group").write_text(group + f"{USER}:x:{SANDBOX_UID}:\n")
    for name in ("passwd", "group"):
        os.chmod(etc / name, 0o644)
    if trust.extra_certs() is not None:  # HUTCH_SANDBOX_CA_CERTS: the runtime's bundle, then the operator's
        bundle = stage / trust.BUNDLE.lstrip("/")
        for parent in reversed([p for p in bundle.parents if stage in p.parents and not p.exists()]):
            parent.mkdir()
            os.chmod(parent, os.stat(below(str(parent.relative_to(stage)))).st_mode & 0o7777)
        bundle.write_bytes(trust.bundle(below(trust.BUNDLE.lstrip("/")).read_bytes()))
        os.chmod(bundle, 0o644)
    init = stage / INIT_SHELL.lstrip("/")
    init.parent.mkdir(parents=True)
    shutil.copyfile(below("usr/bin/dash"), init)
    os.chmod(init, 0o111)
    os.chmod(init.parent, 0o755)
    os.chmod(init.parent.parent, 0o755)
    for rel in (HOME, rootfs.WORKSPACE):
        path = stage / rel.lstrip("/")
        parent = path.parent
        if parent != stage and not parent.exists():
            parent.mkdir(parents=True)
            os.chmod(parent, os.stat(below(str(parent.relative_to(stage)))).st_mode & 0o7777)
        path.mkdir()
        os.chown(path, SANDBOX_UID, SANDBOX_UID)
        os.chmod(path, 0o755)


def _copy_without_whiteouts(tree: Path, dest: Path) -> list[str]:
    """An overlay upper dir as an image layer: its whiteouts (0/0 character devices, the
    overlay's mark for "deleted below") are left out of the copy and returned, to be
    inserted as OCI whiteouts."""
    whiteouts: list[str] = []

    def skip(directory: str, names: list[str]) -> list[str]:
        found = [n for n in names if _is_whiteout(Path(directory) / n)]
        whiteouts.extend("/" + str((Path(directory) / n).relative_to(tree)) for n in found)
        return found

    shutil.copytree(tree, dest, symlinks=True, ignore=skip)
    return sorted(whiteouts)


def _is_whiteout(path: Path) -> bool:
    st = os.lstat(path)
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == 0


def push(recipe: RuntimeRecipe, registry: str, *, cache: Path | None = None, layer: str | None = None) -> str:
    """Build the runtime's OCI image from its rootfs (and an install layer) and push it.
    Returns the ref."""
    cache = cache or rootfs.default_cache()
    root = rootfs.rootfs_path(cache, recipe)
    if not root.is_dir():
        raise DriverFailure(f"runtime {recipe.name} is not built; {rootfs.build_hint(recipe.name, cache)}")
    for tool in ("umoci", "skopeo"):
        if shutil.which(tool) is None:
            raise DriverFailure(f"{tool} is not installed (apt-get install {tool})")
    ref = image_ref(recipe, registry, layer)
    tag = "image"
    with tempfile.TemporaryDirectory(prefix="hutch-image-") as tmp:
        layout = Path(tmp) / "oci"
        stage = Path(tmp) / "stage"
        stage.mkdir()
        roots = layers.lowers(cache, recipe, layer)
        _stage_user_layer(roots, stage)
        image = f"{layout}:{tag}"
        _run(["umoci", "init", "--layout", str(layout)])
        _run(["umoci", "new", "--image", image])
        _run(["umoci", "insert", "--no-history", "--image", image, str(root), "/"])
        if layer:
            installed = Path(tmp) / "installed"
            for gone in _copy_without_whiteouts(layers.layer_path(cache, layer), installed):
                _run(["umoci", "insert", "--no-history", "--image", image, "--whiteout", gone])
            _run(["umoci", "insert", "--no-history", "--image", image, str(installed), "/"])
        _run(["umoci", "insert", "--no-history", "--image", image, str(stage), "/"])
        _run(["umoci", "config", "--no-history", "--image", image,
              "--config.workingdir", HOME,
              "--config.env", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
              "--config.env", f"HOME={HOME}", "--config.env", "LANG=C.UTF-8",
              "--config.cmd", "/bin/sh",
              "--config.label", f"dev.hutch.runtime={recipe.name}",
              "--config.label", f"dev.hutch.recipe={recipe.recipe_hash}"])
        _run(["skopeo", "copy", "--quiet", "--dest-tls-verify=false", f"oci:{image}", f"docker://{ref}"])
    return ref


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hutch.drivers.nomad.images",
                                     description="Runtime images for the nomad driver.")
    parser.add_argument("command", choices=["ref", "exists", "push"])
    parser.add_argument("name", help="catalog name, e.g. base:latest")
    parser.add_argument("--registry", default=os.environ.get("HUTCH_NOMAD_REGISTRY", "127.0.0.1:5000"))
    parser.add_argument("--cache", type=Path, default=None)
    args = parser.parse_args(argv)
    recipe = rootfs.lookup(args.name)
    if args.command == "ref":
        print(image_ref(recipe, args.registry))
        return 0
    if args.command == "exists":
        return 0 if exists(recipe, args.registry) else 1
    print(push(recipe, args.registry, cache=args.cache))
    return 0


if __name__ == "__main__":
    sys.exit(main())
