"""The Workspace's ``docker`` backend (seed 004's third): the workspace, a directory of this
machine, bind-mounted into a long-lived container of a Docker engine; code runs by ``docker
exec``, files are read and written in the directory (as unix-local does: hutch/_workspace_files.py).

The code is untrusted, so the container gets what Docker allows of confinement: no network
(``none``), every capability dropped, no-new-privileges, Docker's default seccomp profile, a
read-only root with a small tmpfs at /tmp, memory, CPU (one core) and pids limits, tini as PID 1 (orphans are
reaped), and a uid that is not root, claimed from the local driver's range (host-wide registry,
never a host account). The image is the runtime's root filesystem (the same tree the local driver
runs), imported into the engine on first use.

The workspace directory is a file system of its own, of ``DISK`` bytes: a sparse image file
beside it, loop-mounted (drivers/local/disks.py, as a local sandbox's ``resources.disk``). The
container's only other writable places are tmpfs (bounded, counted in its memory), so its code
meets ENOSPC at the bound and the host's disk keeps its room. Docker's own bound
(``--storage-opt size=``) needs overlay on XFS with project quotas, which this host's kernel
lacks, and would not cover a bind mount anyway. A loop mount needs root: run as another user,
the backend refuses to start, naming why.

Needs the Docker SDK for Python (``pip install 'hutch[docker]'``) and an engine on this machine
(a bind mount names a path of the engine's host): ``./scripts/services start docker`` runs one
that changes no firewall rule (see that script).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import logging
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

log = logging.getLogger("hutch.workspace")

HOME = "/home/agentuity"  # the runtimes' sandbox home: the same place as in a sandbox
LABEL = "hutch.workspace"  # marks the containers of this backend; reattach refuses any other
ROOTFS_LABEL = "hutch.rootfs"  # the built tree (name-hash) an image was imported from
MEMORY = "2g"  # also the swap limit: no swap beyond it
PIDS = 1024  # the local driver's default (HUTCH_DEFAULT_PIDS)
CPUS = 10**9  # one core, in Docker's nano-CPUs: the local driver's default (HUTCH_DEFAULT_CPU)
DISK = 4 * 2**30  # the workspace's file system, bytes: sparse, the host gives what is written
DISK_IMAGE = "disk.img"  # beside the workspace directory, in the backend's state directory
TMP = "rw,nosuid,nodev,size=256m,mode=1777"
KILL_GRACE = 2.0  # seconds for output to drain after a timed-out command's tree is killed
INSTALL = "pip install 'hutch[docker]'  (or: pip install docker)"
START_ENGINE = ("start one (as root, from a hutch checkout: ./scripts/services start docker, then export "
                "the DOCKER_HOST it prints) or set DOCKER_HOST to an engine on this machine")
ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": HOME, "USER": "agentuity",
       "LOGNAME": "agentuity", "SHELL": "/bin/bash", "LANG": "C.UTF-8"}  # as the local driver's executions

_importing = threading.Lock()  # one import of an image at a time in this process


class DockerUnavailable(RuntimeError):
    """The docker backend cannot run here: the SDK is not installed or no engine answers."""


def require_sdk() -> None:
    """Raise DockerUnavailable, with the command that installs it, when the SDK is missing."""
    try:
        found = importlib.util.find_spec("docker") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise DockerUnavailable("backend 'docker' needs the Docker SDK for Python (the `docker` package), which "
                                f"is not installed: {INSTALL}")


def image_ref(runtime: str) -> str:
    name, _, tag = runtime.partition(":")
    return f"hutch/{re.sub(r'[^a-z0-9._-]', '-', name.lower())}:{re.sub(r'[^A-Za-z0-9._-]', '-', tag or 'latest')}"


def _engine_address() -> str:
    return os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock (the default: DOCKER_HOST is not set)"


def _connect() -> Any:
    import docker
    import requests

    host = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    if host.startswith("unix://"):
        # Tried here first: docker-py leaves the socket of a connect that failed unclosed.
        with socket.socket(socket.AF_UNIX) as probe:
            probe.settimeout(10)
            try:
                probe.connect(host.removeprefix("unix://"))
            except PermissionError:
                raise DockerUnavailable(f"backend 'docker': this user may not use the Docker engine at "
                                        f"{_engine_address()} (root or the socket's group, usually docker, may)"
                                        ) from None
            except OSError as err:
                raise DockerUnavailable(f"backend 'docker': no Docker engine answers at {_engine_address()} "
                                        f"({err.strerror or err}); {START_ENGINE}") from None
    try:
        client = docker.from_env()
        client.ping()
    except (docker.errors.DockerException, requests.RequestException) as err:
        raise DockerUnavailable(f"backend 'docker': no Docker engine answers at {_engine_address()} ({err}); "
                                f"{START_ENGINE}") from err
    return client


class DockerBox:
    """One workspace's container and its directory on this machine."""

    def __init__(self, client: Any, container_id: str, state: Path, uid: int, gid: int) -> None:
        self.client, self.id, self.state, self.uid, self.gid = client, container_id, state, uid, gid

    @property
    def root(self) -> Path:
        return self.state / "workspace"

    @property
    def owner(self) -> tuple[int, int] | None:
        """Who gets what this process makes in the workspace (None: it is this process's uid)."""
        return None if os.geteuid() == self.uid else (self.uid, self.gid)

    # ------------------------------------------------------------ lifecycle

    @classmethod
    async def create(cls, runtime: str, env: Mapping[str, str]) -> DockerBox:
        return await asyncio.to_thread(cls._create, runtime, env)

    @classmethod
    def _create(cls, runtime: str, env: Mapping[str, str]) -> DockerBox:
        client = _connect()
        if os.geteuid() != 0:
            client.close()
            raise DockerUnavailable(f"backend 'docker' bounds the workspace's disk ({DISK // 2**20} MiB) with a "
                                    "loop-mounted file system, which needs root: run it as root, or use backend "
                                    "'sandbox' (rootless too)")
        state = Path(tempfile.mkdtemp(prefix="hutch-docker-"))  # 0700: no other host user gets in
        try:
            image = _image(client, runtime)
            uid, gid = _claim_uid(state)
            _make_disk(state, uid, gid)
            container = _run_container(client, image, state / "workspace", uid, gid, env)
            return cls(client, container.id, state, uid, gid)
        except BaseException:
            _discard(state)
            client.close()
            raise

    @classmethod
    async def attach(cls, container_id: str) -> DockerBox:
        return await asyncio.to_thread(cls._attach, container_id)

    @classmethod
    def _attach(cls, container_id: str) -> DockerBox:
        import docker

        client = _connect()
        try:
            try:
                container = client.containers.get(container_id)
            except docker.errors.NotFound as err:
                raise ValueError(f"workspace_id: no docker workspace {container_id!r} in the engine at "
                                 f"{_engine_address()}") from err
            if container.labels.get(LABEL) != "1":
                raise ValueError(f"workspace_id: container {container_id!r} is not a hutch workspace")
            source = next((m["Source"] for m in container.attrs.get("Mounts", []) if m.get("Destination") == HOME), None)
            if source is None or not Path(source).is_dir():
                raise RuntimeError(f"docker workspace {container_id!r}: its directory ({source}) is not on this machine")
            state = Path(source).parent
            if not (state / DISK_IMAGE).is_file():
                raise ValueError(f"workspace_id: docker workspace {container_id!r} has no disk bound (made by an "
                                 f"older hutch): its files are in {source}; start a new workspace with them")
            if not os.path.ismount(source):  # the host restarted: the files are all in the image
                from hutch.drivers.local import disks

                if container.status == "running":  # it holds the old mount: one file system, mounted once
                    container.kill()
                    container.wait()
                disks.remount(state / DISK_IMAGE, Path(source))
                container.reload()
            uid, _, gid = str(container.attrs["Config"]["User"]).partition(":")
            if container.status != "running":  # the engine restarted: the files are all there
                container.start()
            return cls(client, container.id, state, int(uid), int(gid or uid))
        except BaseException:
            client.close()
            raise

    async def remove(self) -> None:
        await asyncio.to_thread(self._remove)

    def _remove(self) -> None:
        import docker

        try:
            with contextlib.suppress(docker.errors.NotFound):
                self.client.api.remove_container(self.id, force=True)  # kills what still runs in it
        finally:
            try:
                _discard(self.state)
            finally:
                self.client.close()

    def close(self) -> None:
        """Let go of the engine connection; the container and its files stay (detach)."""
        self.client.close()

    # ------------------------------------------------------------ code

    async def exec(self, argv: Sequence[str], timeout: float) -> tuple[str, str, int, bool]:
        return await asyncio.to_thread(self._exec, list(argv), timeout)

    def _exec(self, argv: list[str], timeout: float) -> tuple[str, str, int, bool]:
        api = self.client.api
        exec_id = api.exec_create(self.id, argv, stdout=True, stderr=True, stdin=False,
                                  user=f"{self.uid}:{self.gid}", workdir=HOME)["Id"]
        # Started by hand rather than with exec_start(socket=True): that hands back the bare socket,
        # and output that arrived with the response headers is in the HTTP reader's buffer, not in
        # it. Without an Upgrade header the engine answers 200 and streams until the command ends.
        res = api.post(f"{api.base_url}/v{api.api_version}/exec/{exec_id}/start", json={"Detach": False, "Tty": False},
                       stream=True, timeout=(30, None))
        try:
            if res.status_code >= 400:
                raise RuntimeError(f"docker exec failed ({res.status_code}): {res.text.strip()}")
            # http.client's response under urllib3's (docker-py reads hijacked streams there too);
            # read timeout None above: a quiet command is not a dead engine, the deadline is ours.
            stream = res.raw._fp
            received = bytearray()
            reader = threading.Thread(target=_drain, args=(stream, received), daemon=True)
            reader.start()
            reader.join(timeout)
            timed_out = reader.is_alive()
            if timed_out:
                self._kill(api.exec_inspect(exec_id).get("Pid"))
                reader.join(KILL_GRACE)
                if reader.is_alive():  # something that escaped the kill still holds the output open
                    _hang_up(stream)
                    reader.join()
        finally:
            res.close()
        out, err = _demux(bytes(received))
        code = 124 if timed_out else _exit_code(api, exec_id)
        return out.decode(errors="replace"), err.decode(errors="replace"), code, timed_out

    def _kill(self, pid: int | None) -> None:
        """SIGKILL what the timed-out command started: its session (a docker exec is a session
        leader; children that it left behind stay members after they are re-parented to tini)
        and its descendants (those that started a session of their own too). All are stopped
        first, so none forks or is re-parented while the set is read, then killed."""
        if not pid:
            return
        stopped: set[int] = set()
        while True:
            fresh = {p for p in _session_and_descendants(pid) if p not in stopped and _in_container(p, self.id)}
            if not fresh:
                break
            for p in fresh:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p, signal.SIGSTOP)
            stopped |= fresh
        for p in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)


def _drain(stream: Any, into: bytearray) -> None:
    with contextlib.suppress(OSError, ValueError):
        while chunk := stream.read1(1 << 16):
            into += chunk


def _hang_up(stream: Any) -> None:
    with contextlib.suppress(OSError, ValueError), socket.socket(fileno=os.dup(stream.fileno())) as sock:
        sock.shutdown(socket.SHUT_RDWR)  # ends the reader's read on every descriptor of the connection


def _demux(raw: bytes) -> tuple[bytes, bytes]:
    """Docker's multiplexed stream: frames of an 8-byte header (stream, size) and the bytes."""
    out, err, at = bytearray(), bytearray(), 0
    while at + 8 <= len(raw):
        stream, size = struct.unpack(">BxxxL", raw[at:at + 8])
        (err if stream == 2 else out).extend(raw[at + 8:at + 8 + size])
        at += 8 + size
    return bytes(out), bytes(err)


def _exit_code(api: Any, exec_id: str) -> int:
    for _ in range(200):  # the stream can end a moment before the engine records the exit
        info = api.exec_inspect(exec_id)
        if not info.get("Running") and info.get("ExitCode") is not None:
            return int(info["ExitCode"])
        time.sleep(0.01)
    return 1


def _session_and_descendants(leader: int) -> set[int]:
    children: dict[int, list[int]] = {}
    members = {leader}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        pid, ppid, sid = int(entry.name), int(fields[1]), int(fields[3])
        children.setdefault(ppid, []).append(pid)
        if sid == leader:
            members.add(pid)
    todo = [leader]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in members:
                members.add(child)
                todo.append(child)
    return members


def _in_container(pid: int, container_id: str) -> bool:
    # A pid read from /proc may have been reused by then: only a process of this container is ours.
    try:
        with open(f"/proc/{pid}/cgroup") as fh:
            return container_id in fh.read()
    except OSError:
        return False


def _claim_uid(state: Path) -> tuple[int, int]:
    from hutch.drivers.local import uids
    from hutch.drivers.local.smallfiles import put

    uid = uids.claim(state)  # stale once the state directory is gone, as for a sandbox
    put(state / "uid", str(uid).encode())
    return uid, uid


def _make_disk(state: Path, uid: int, gid: int) -> None:
    """``state/workspace``: a fresh file system of DISK bytes, the container user's, empty."""
    from hutch.drivers.local import disks

    root = state / "workspace"
    disks.make(state / DISK_IMAGE, root, DISK)
    os.rmdir(root / "lost+found")  # ext4's, not the workspace's: it would show in every listing
    os.chown(root, uid, gid)
    os.chmod(root, 0o755)


def _discard(state: Path) -> None:
    """The workspace's file system unmounted, its uid released and its state directory gone."""
    from hutch.drivers.local import disks

    try:
        disks.unmount(state / "workspace", state / DISK_IMAGE)  # first: rmtree must not empty a mount
    finally:
        if (state / "uid").exists():
            from hutch.drivers.local import uids

            uids.release(state)
        shutil.rmtree(state, ignore_errors=True)  # fd-based: no symlink in it is followed


def _run_container(client: Any, image: str, root: Path, uid: int, gid: int, env: Mapping[str, str]) -> Any:
    import docker
    from docker.types import Mount

    try:
        container = client.containers.create(
            image, ["sleep", "infinity"], init=True, user=f"{uid}:{gid}", working_dir=HOME,
            environment={**ENV, **env}, hostname="sandbox", labels={LABEL: "1"},
            mounts=[Mount(HOME, str(root), type="bind")], network_mode="none", cap_drop=["ALL"],
            security_opt=["no-new-privileges"], read_only=True, tmpfs={"/tmp": TMP},
            mem_limit=MEMORY, memswap_limit=MEMORY, pids_limit=PIDS, nano_cpus=CPUS)
    except docker.errors.APIError as err:
        if "bind source path does not exist" in str(err):
            raise DockerUnavailable(f"backend 'docker': the engine at {_engine_address()} does not see {root}: it "
                                    "must run on this machine (the workspace is a bind mount)") from err
        raise
    try:
        container.start()
    except BaseException:
        with contextlib.suppress(docker.errors.APIError):
            container.remove(force=True)  # made but not started: nothing else would remove it
        raise
    return container


def _image(client: Any, runtime: str) -> str:
    """The engine's image of ``runtime``, imported from its built tree when missing or older."""
    import docker

    from hutch.core.errors import RuntimeNotFound
    from hutch.drivers.local import rootfs

    try:
        recipe = rootfs.lookup(runtime)
    except RuntimeNotFound as err:
        raise ValueError(f"runtime: {err.message}") from err
    ref, cache = image_ref(recipe.name), rootfs.default_cache()
    key, built = rootfs.cache_key(recipe), rootfs.is_built(cache, recipe)
    with _importing:
        try:
            if client.images.get(ref).labels.get(ROOTFS_LABEL) == key or not built:
                return ref  # current, or the only one there is
        except docker.errors.ImageNotFound:
            if not built:
                raise RuntimeError(f"backend 'docker': the engine has no image {ref} and runtime {recipe.name} is not "
                                   f"built on this host, to import it from; build it with: "
                                   f"{rootfs.build_hint(recipe.name, cache)}") from None
        _import(client, rootfs.rootfs_path(cache, recipe), ref, key)
    return ref


def _import(client: Any, tree: Path, ref: str, key: str) -> None:
    log.warning("hutch: importing runtime tree %s into the Docker engine as %s (first use of this runtime on "
                "this engine; a few seconds)", tree, ref)
    started = time.monotonic()
    repo, _, tag = ref.rpartition(":")
    # --ignore-failed-read: a host user who is not root cannot read a few root-only files of the
    # tree (/etc/shadow); the image does without them.
    with tempfile.TemporaryFile() as errors, subprocess.Popen(
            ["tar", "--numeric-owner", "--ignore-failed-read", "-C", str(tree), "-c", "."],
            stdout=subprocess.PIPE, stderr=errors) as tar:
        assert tar.stdout is not None
        answer = client.api.import_image_from_data(_chunks(tar.stdout), repository=repo, tag=tag,
                                                   changes=[f"WORKDIR {HOME}", f"LABEL {ROOTFS_LABEL}={key}"])
        tar.wait()
        errors.seek(0)
        complaint = errors.read().decode(errors="replace").strip()
    if tar.returncode != 0 or '"error' in str(answer):
        raise RuntimeError(f"backend 'docker': importing {tree} as {ref} failed: {complaint or answer}")
    log.warning("hutch: imported %s in %.1f s", ref, time.monotonic() - started)


def _chunks(stream: IO[bytes]) -> Iterator[bytes]:
    while chunk := stream.read(1 << 20):  # streamed: the tree is hundreds of MB
        yield chunk
