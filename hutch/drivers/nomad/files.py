"""The nomad driver's file primitives and disk checkpoints, done inside the sandbox.

Each primitive is one alloc exec of a small POSIX shell script (coreutils and findutils
are in every runtime) running in the sandbox's container as the sandbox user, with the
workspace as its working directory. So a path means exactly what it means to the
sandbox's own commands: ``..``, absolute paths and planted symlinks can only reach what
the sandbox could reach anyway, never the Nomad client's files.

Failures come back as coreutils' words for an errno ("No such file or directory", …);
they are mapped to the same errors the local driver raises (``drivers.fserrors``).
Reads and writes stream through the exec websocket with flow control in both directions,
and both wait for the script's "ok" before any content moves, so a bad path fails before
an upload is sent.

Disk checkpoints are tar archives of the workspace (the part of a container that outlives
it; made by the same export as archive downloads), kept in the blob store (``core.blobs``:
files under the data dir, or PostgreSQL in the production profile, so any API replica can
restore them) and unpacked back over an emptied workspace on restore. They are full
copies: the API server and the Nomad client need not share a filesystem, so links or
reflinks are not available.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import io
import json
import logging
import os
import posixpath
import tarfile
import time
import uuid
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path

from hutch.core import limits
from hutch.core.blobs import BlobNotFound, BlobStore, BlobUnavailable, check_key
from hutch.core.errors import (
    CheckpointNotFound,
    DriverFailure,
    HutchError,
    InvalidInput,
    PayloadTooLarge,
    QuotaExceeded,
    SandboxBusy,
    SandboxNotFound,
)
from hutch.core.quantities import format_bytes
from hutch.drivers.base import FileInfo, FileWrite
from hutch.drivers.fserrors import from_errno, named_path
from hutch.drivers.nomad.access import SandboxAccess
from hutch.drivers.nomad.client import ExecFailed
from hutch.drivers.nomad.execs import ENVELOPE, run_tagged
from hutch.drivers.nomad.jobs import HOME, TASK
from hutch.drivers.nomad.state import NomadSandbox
from hutch.storage.spool import fetch, put_file, read_file, spool

# The one script every primitive runs: $1 = op, $2 = path, then the op's own arguments.
# fail() prints a strerror text, which the driver maps back to an errno.
log = logging.getLogger(__name__)
CHECKPOINTS = "nomad/checkpoints"  # blob keys: CHECKPOINTS/<sandbox id>/<checkpoint id>.tar

_SCRIPT = r"""
fail() { printf 'hutch-fs: %s\n' "$1" >&2; exit 3; }
op=$1; p=$2; shift 2
[ -n "$p" ] || p=.
case $op in
read)
  [ -e "$p" ] || fail "No such file or directory"
  [ -d "$p" ] && fail "Is a directory"
  [ -f "$p" ] || fail "Invalid argument"
  [ -r "$p" ] || fail "Permission denied"
  printf 'ok\n'
  exec cat -- "$p" ;;
write)
  d=$(dirname -- "$p")
  if [ "$2" = 1 ] && [ ! -d "$d" ]; then mkdir -p -- "$d" || exit 3; fi
  [ -d "$d" ] || fail "No such file or directory"
  [ -d "$p" ] && fail "Is a directory"
  if [ -e "$p" ] && [ ! -f "$p" ]; then fail "Invalid argument"; fi
  # Every process the write needs is made before the old content is cut: at the pids limit
  # a fork refused after the cut left the file empty. Opened (made if absent) but not cut;
  # cat forked now, reading nothing before our "ok" (the driver sends the content only then;
  # a background job's stdin is /dev/null, so it gets ours as fd 4); then one fork that cuts
  # a file with content (a cut of nothing is a change a watcher sees for nothing) and
  # becomes chmod. A watcher sees the local driver's order (made or cut, mode, content), and
  # the content goes through the descriptor opened first (a read-only mode holds no write back).
  exec 3>> "$p" 4<&0 || exit 3
  cat <&4 >&3 4<&- &
  c=$!
  ( exec 4<&-; if [ -s "$p" ]; then : > "$p" || exit 3; fi; exec chmod "$1" -- "$p" ) || { kill "$c"; exit 3; }
  printf 'ok\n'
  wait "$c" || exit 3 ;;
list)
  if [ ! -e "$p" ] && [ ! -L "$p" ]; then fail "No such file or directory"; fi
  if [ -d "$p" ]; then
    find "$p/" -mindepth 1 -maxdepth 1 -printf '%y %m %s %T@ %u %g\0%f\0%l\0' || exit 3
  else
    find "$p" -maxdepth 0 -printf '%y %m %s %T@ %u %g\0%f\0%l\0' || exit 3
  fi ;;
mkdir)
  [ -d "$p" ] && exit 0
  if [ -e "$p" ] || [ -L "$p" ]; then fail "File exists"; fi
  if [ "$1" = 1 ]; then mkdir -p -- "$p" || exit 3; else mkdir -- "$p" || exit 3; fi ;;
rm)
  if [ ! -e "$p" ] && [ ! -L "$p" ]; then printf 'absent\n'; exit 0; fi
  if [ "$1" = 1 ]; then
    if [ ! -d "$p" ] || [ -L "$p" ]; then fail "Not a directory"; fi
    if [ "$2" = 1 ]; then rm -rf -- "$p" || exit 3; else rmdir -- "$p" || exit 3; fi
  else
    if [ -d "$p" ] && [ ! -L "$p" ]; then fail "Is a directory"; fi
    rm -f -- "$p" || exit 3
  fi
  printf 'removed\n' ;;
symlink)
  ln -s -- "$1" "$p" || exit 3 ;;
mv)
  if [ ! -e "$p" ] && [ ! -L "$p" ]; then fail "$p: No such file or directory"; fi
  d=$(dirname -- "$1")
  [ -d "$d" ] || mkdir -p -- "$d" || exit 3
  if [ -d "$1" ] && [ ! -L "$1" ] && { [ ! -d "$p" ] || [ -L "$p" ]; }; then fail "$1: Is a directory"; fi
  mv -T -- "$p" "$1" || exit 3 ;;
export)
  if [ ! -e "$p" ] && [ ! -L "$p" ]; then fail "No such file or directory"; fi
  t="tar --numeric-owner --owner=0 --group=0 --null --no-recursion -T - -cf -"
  if [ -d "$p" ] && [ ! -L "$p" ]; then
    cd -- "$p" || exit 3
    printf 'ok\n'
    find . -mindepth 1 \( -type f -o -type d -o -type l \) -printf '%P\0' | $t || exit 3
  else
    cd -- "$(dirname -- "$p")" || exit 3
    printf 'ok\n'
    printf '%s\0' "$(basename -- "$p")" | $t || exit 3
  fi ;;
import)
  mkdir -p -- "$p" || exit 3
  cd -- "$p" || exit 3
  printf 'ok\n'
  exec tar -x -p $1 --no-same-owner -f - ;;
restore)
  cd -- "$p" || exit 3
  find . -mindepth 1 -delete || exit 3
  # Blocks freed in the open journal transaction are not reusable until it commits: on a
  # disk-limited workspace the unpack could hit ENOSPC for room it just freed. Commit now.
  sync -f . 2>/dev/null || sync
  printf 'ok\n'
  exec tar -x -p --no-same-owner -f - ;;
*) fail "Invalid argument" ;;
esac
"""

_ERRNOS = {os.strerror(n): n for n in (
    errno.ENOENT, errno.ENOTDIR, errno.EISDIR, errno.EEXIST, errno.ENOTEMPTY, errno.EACCES, errno.EPERM,
    errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EINVAL, errno.ELOOP, errno.ENAMETOOLONG,
)}
_ERRNOS["Directory nonexistent"] = errno.ENOENT  # dash's words for a redirection into a missing directory
_TYPE_BITS = {"f": 0o100000, "d": 0o040000, "l": 0o120000, "p": 0o010000, "s": 0o140000, "c": 0o020000,
              "b": 0o060000}
_QUEUE_DEPTH = 8  # output frames held for a slow reader before the command is slowed down
# What one file operation that is not streamed may print: the server holds it whole, and a
# listing then costs ~1.6 KB of its memory per entry (170,000 files grew it by 268 MiB per
# request). 32 MiB lists ~150,000 entries of 200-character names, a million of short ones.
MAX_OUTPUT = 32 * 2**20


def pack_files(files: Sequence[FileWrite]) -> bytes:
    """Create-time files as a tar stream of paths under the workspace, for ``tar -x`` run in
    the sandbox as the sandbox user (the driver's ``write_files``)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for f in files:
            if not f.path or "\0" in f.path or len(f.path) > 4096:
                raise InvalidInput(f"invalid path {f.path!r}", field="path")
            path = posixpath.normpath(posixpath.join(HOME, f.path))
            info = tarfile.TarInfo(path.lstrip("/"))
            info.size = len(f.content)
            info.mode = f.mode & 0o777
            info.mtime = int(time.time())
            tar.addfile(info, io.BytesIO(f.content))
    return buf.getvalue()


def _check_path(path: str, field: str = "path") -> str:
    if "\0" in path or len(path) > 4096:
        raise InvalidInput(f"{field}: not a usable path: {path[:100]!r}", field=field)
    return path


class NomadFiles:
    """The driver's file primitives and checkpoints (NomadDriver delegates to one of these).

    Checkpoints are kept in ``blobs`` as ``nomad/checkpoints/<sandbox>/<checkpoint>.tar``
    (the server's blob store: files under the data dir, as they always were, or PostgreSQL),
    spooled through ``state_dir/spool``."""

    def __init__(self, access: SandboxAccess, state_dir: Path, blobs: BlobStore) -> None:
        self._access = access
        self._blobs = blobs
        self.spool_dir = state_dir / "spool"

    # ------------------------------------------------------------------ plumbing

    async def _fs(
        self,
        sb: NomadSandbox,
        op: str,
        path: str,
        *args: str,
        stdin: AsyncIterable[bytes] | None = None,
        on_stdout: Callable[[bytes], Awaitable[None]] | None = None,
        stop: asyncio.Event | None = None,
        verify: bool = False,
    ) -> tuple[int | None, bytes, bytes]:
        """Run the script; (exit code or None if it was stopped, stdout if not streamed, stderr)."""
        self._access.check_not_paused(sb)
        tag = f"f-{uuid.uuid4().hex}"
        # noStdin: the plugin gives it an empty stdin, and nothing is sent (NomadClient.exec).
        envelope = json.dumps({"env": self._access.command_env(sb, {}), "cwd": HOME, "tag": tag,
                               "noStdin": stdin is None})
        out, err = bytearray(), bytearray()
        stop = stop or asyncio.Event()
        overflow = False

        async def on_output(stream: str, data: bytes) -> None:
            nonlocal overflow
            if stream == "stderr":
                err.extend(data)
                del err[:-8192]
            elif on_stdout is not None:
                await on_stdout(data)
            elif overflow or len(out) + len(data) > MAX_OUTPUT:
                overflow = True
                out.clear()
                stop.set()  # the command is killed
            else:
                out.extend(data)

        try:
            # run_tagged: a write that meets ENOSPC while its content streams in keeps its words.
            code = await run_tagged(
                self._access.client, sb.alloc_id, TASK,
                [ENVELOPE, envelope, "/bin/sh", "-c", _SCRIPT, "hutch-fs", op, path, *args], tag,
                stdin=stdin, on_output=on_output, stop=stop,
                kill=lambda: self._access.kill_tagged(sb, tag), verify=verify)
        except ExecFailed as err_:
            if self._access.gone(sb.id):
                raise SandboxNotFound(f"sandbox {sb.id} was destroyed") from err_
            raise DriverFailure(f"sandbox {sb.id}: file operation {op} failed: {err_.reason}") from err_
        if overflow:
            raise PayloadTooLarge(f"{op} {path}: the sandbox's answer passed {format_bytes(MAX_OUTPUT)} (a directory "
                                  "of too many entries?); name a narrower path", field="path")
        return code, bytes(out), bytes(err)

    def _failure(self, sb: NomadSandbox, op: str, path: str, code: int | None, stderr: bytes) -> HutchError:
        if self._access.gone(sb.id):
            return SandboxNotFound(f"sandbox {sb.id} was destroyed")
        lines = stderr.decode(errors="replace").strip().splitlines()
        for line in reversed(lines):  # tar names the cause first, then "Error is not recoverable"
            for text, num in _ERRNOS.items():
                if line.endswith(text):
                    ours = op == "mv" and line.startswith("hutch-fs: ")  # the script's own words name the path
                    return from_errno(op, named_path(line, num, path) if ours else path, num, line, sb.id)
        if any(line.endswith(("Cannot fork", "can't fork")) for line in lines):  # sh's words at the pids limit
            return SandboxBusy(f"sandbox {sb.id} is at its pids limit: file operation {op} on {path} could not "
                               "start its process; end some of its processes, or create it with a higher pids limit")
        message = "; ".join(lines[-3:])
        return DriverFailure(f"sandbox {sb.id}: file operation {op} on {path} failed "
                             f"({message or f'exit {code}'})")

    async def _simple(self, sandbox_id: str, op: str, path: str, *args: str) -> bytes:
        sb = self._access.running(sandbox_id)
        code, out, err = await self._fs(sb, op, _check_path(path), *args)
        if code != 0:
            raise self._failure(sb, op, path, code, err)
        return out

    # ------------------------------------------------------------------ the primitives

    async def read_file(self, sandbox_id: str, path: str) -> AsyncIterator[bytes]:
        async for chunk in self._streamed(sandbox_id, "read", path):
            yield chunk

    async def export_tar(self, sandbox_id: str, path: str) -> AsyncIterator[bytes]:
        async for chunk in self._streamed(sandbox_id, "export", path):
            yield chunk

    async def import_tar(self, sandbox_id: str, dest: str, archive: AsyncIterable[bytes], *, gzipped: bool) -> None:
        await self._fed(sandbox_id, "import", dest, archive, "-z" if gzipped else "--no-auto-compress")

    async def _streamed(self, sandbox_id: str, op: str, path: str) -> AsyncIterator[bytes]:
        """The script's stdout after its "ok", as it comes, with backpressure."""
        sb = self._access.running(sandbox_id)
        _check_path(path)
        queue: asyncio.Queue[bytes] = asyncio.Queue(maxsize=_QUEUE_DEPTH)
        stop = asyncio.Event()
        # verify: a read or an export must arrive whole (drivers/nomad/execs.py)
        task = asyncio.ensure_future(self._fs(sb, op, path, on_stdout=queue.put, stop=stop, verify=True))
        head, started = b"", False
        try:
            while True:
                getter = asyncio.ensure_future(queue.get())
                done, _ = await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
                if getter in done:
                    data = getter.result()
                else:
                    getter.cancel()
                    if queue.empty():
                        break
                    data = queue.get_nowait()
                if not started:
                    head += data
                    if len(head) < 3:
                        continue
                    if head[:3] != b"ok\n":
                        raise DriverFailure(f"sandbox {sb.id}: unexpected answer to {op} {path}: {head[:40]!r}")
                    started, data = True, head[3:]
                if data:
                    yield data
            code, _, err = task.result()
            if code != 0 or not started:
                raise self._failure(sb, op, path, code, err)
        finally:
            if not task.done():  # the reader went away: stop the cat
                stop.set()
                with contextlib.suppress(Exception, asyncio.CancelledError):
                    await asyncio.wait_for(task, 10)

    async def write_file(
        self, sandbox_id: str, path: str, chunks: AsyncIterable[bytes], *, mode: int = 0o644, parents: bool = True
    ) -> int:
        return await self._fed(sandbox_id, "write", path, chunks, "%o" % (mode & 0o777), "1" if parents else "0")

    async def _fed(self, sandbox_id: str, op: str, path: str, chunks: AsyncIterable[bytes], *args: str) -> int:
        """Run the script with ``chunks`` as its stdin, sent only after its "ok"."""
        sb = self._access.running(sandbox_id)
        _check_path(path)
        ready, stop = asyncio.Event(), asyncio.Event()
        total = 0
        failed: list[BaseException] = []
        head = bytearray()

        async def on_stdout(data: bytes) -> None:
            head.extend(data)
            if head.startswith(b"ok\n"):
                ready.set()

        async def body() -> AsyncIterator[bytes]:
            nonlocal total
            await ready.wait()  # the path checked out: only now does content move
            try:
                async for chunk in chunks:
                    total += len(chunk)
                    yield chunk
            except BaseException as err:  # the upload itself failed: the file must not look complete
                failed.append(err)
                stop.set()
                raise

        code, _, err = await self._fs(sb, op, path, *args, stdin=body(), on_stdout=on_stdout, stop=stop)
        if failed and code == 0 and op != "write" and isinstance(failed[0], (asyncio.CancelledError, GeneratorExit)):
            # Not the source failing: the command finished and its stdin was cut. tar exits
            # once it has read the archive's end blocks, with the rest of the feed (gzip's
            # trailer, padding, the source's own end-of-stream round trip) still unsent.
            failed.clear()
        if failed:
            if op == "write":  # a half-sent file must not look complete
                with contextlib.suppress(HutchError):
                    await self._simple(sandbox_id, "rm", path, "0", "0")
            raise failed[0]
        if code != 0:
            raise self._failure(sb, op, path, code, err)
        return total

    async def list_files(self, sandbox_id: str, path: str) -> list[FileInfo]:
        out = await self._simple(sandbox_id, "list", path)
        fields = out.split(b"\0")
        if len(out) > limits.LIST_BYTES or len(fields) // 3 > limits.LIST_ENTRIES:
            raise limits.too_many_entries(path)  # each entry is held whole in the server (core/limits.py)
        entries = []
        for i in range(0, len(fields) - 2, 3):
            head = fields[i].decode().split(" ")
            kind, perm, size, mtime = head[:4]
            owner, group = head[4:6] if len(head) == 6 else ("", "")  # a name with a space: not said
            name, link = os.fsdecode(fields[i + 1]), os.fsdecode(fields[i + 2])
            st_mode = _TYPE_BITS.get(kind, 0) | int(perm, 8)
            entries.append(FileInfo(
                name=name, size=int(size), is_dir=kind == "d", mode=st_mode, mod_time=float(mtime),
                is_symlink=kind == "l", link_target=link if kind == "l" else None, owner=owner, group=group))
        entries.sort(key=lambda e: e.name)
        return entries

    async def mkdir(self, sandbox_id: str, path: str, *, parents: bool) -> None:
        await self._simple(sandbox_id, "mkdir", path, "1" if parents else "0")

    async def remove(self, sandbox_id: str, path: str, *, directory: bool, recursive: bool) -> bool:
        out = await self._simple(sandbox_id, "rm", path, "1" if directory else "0", "1" if recursive else "0")
        return out.startswith(b"removed")

    async def symlink(self, sandbox_id: str, path: str, target: str) -> None:
        await self._simple(sandbox_id, "symlink", path, _check_path(target, "target"))

    async def rename(self, sandbox_id: str, source: str, destination: str) -> None:
        await self._simple(sandbox_id, "mv", source, _check_path(destination, "destination"))

    # ------------------------------------------------------------------ checkpoints

    def _checkpoint_key(self, sandbox_id: str, checkpoint_id: str) -> str:
        if "/" in checkpoint_id or checkpoint_id.startswith("."):
            raise InvalidInput(f"checkpoint id {checkpoint_id!r} is not usable", field="checkpointId")
        return check_key(f"{CHECKPOINTS}/{sandbox_id}/{checkpoint_id}.tar")

    async def checkpoint(self, sandbox_id: str, checkpoint_id: str, *, limit: int | None = None,
                         used: int = 0) -> int:
        """Take it; the bytes it takes. ``limit``: what the sandbox's checkpoints may take in all
        (HUTCH_MAX_CHECKPOINT_BYTES), ``used`` by those it has: the export stops the moment it
        passes what is left (QuotaExceeded), and nothing of it is kept."""
        sb = self._access.running(sandbox_id)
        self._access.check_not_paused(sb)
        key = self._checkpoint_key(sandbox_id, checkpoint_id)
        # Spooled first: the export streams from the sandbox at its own pace, whatever the
        # blob store's; the store gets a complete file.
        export = self.export_tar(sb.id, HOME)
        if limit is not None:
            export = _bounded(export, sandbox_id, limit, used)
        with await spool(export, await self._spool_dir()) as spooled:
            size = os.fstat(spooled.fileno()).st_size
            await put_file(self._blobs, key, spooled)
        return size

    async def restore(self, sandbox_id: str, checkpoint_id: str) -> None:
        sb = self._access.running(sandbox_id)
        self._access.check_not_paused(sb)
        key = self._checkpoint_key(sandbox_id, checkpoint_id)
        # Fetched whole before the restore script empties the workspace, and fed from the
        # local copy: when tar has read the end of the archive it exits, and whatever the
        # feed is still waiting on (a database round trip for the end of the stream) is cut
        # short, which _fed takes for a failed upload.
        try:
            local = await fetch(self._blobs, key, await self._spool_dir())
        except BlobNotFound as err:
            raise CheckpointNotFound(f"checkpoint {checkpoint_id} not found", checkpoint_id=checkpoint_id) from err
        with local:
            await self._fed(sandbox_id, "restore", HOME, read_file(local))

    async def _spool_dir(self) -> Path:
        await asyncio.to_thread(self.spool_dir.mkdir, parents=True, exist_ok=True)
        return self.spool_dir

    async def delete_checkpoint(self, sandbox_id: str, checkpoint_id: str) -> None:
        await self._blobs.delete(self._checkpoint_key(sandbox_id, checkpoint_id))

    async def drop_checkpoints(self, sandbox_id: str) -> None:
        """A destroyed sandbox's checkpoints; a store that is down leaves them (logged), as
        a destroy must not fail over them."""
        try:
            await self._blobs.delete_prefix(f"{CHECKPOINTS}/{sandbox_id}/")
        except BlobUnavailable as err:
            log.warning("sandbox %s: its checkpoints were not removed: %s", sandbox_id, err)


async def _bounded(export: AsyncIterator[bytes], sandbox_id: str, limit: int, used: int) -> AsyncIterator[bytes]:
    """``export`` until it passes ``limit - used`` bytes: then QuotaExceeded, and the export is
    closed (its command in the sandbox stopped). A tar of what a sandbox holds is not bounded
    by its disk: a sparse file of 2 GiB takes nothing there and 2 GiB here."""
    room, taken = limit - used, 0
    try:
        async for chunk in export:
            taken += len(chunk)
            if taken > room:
                raise QuotaExceeded(
                    f"quota checkpoint_bytes: sandbox {sandbox_id}'s checkpoints may take {format_bytes(limit)}; "
                    f"they take {format_bytes(used)}, and this one passed the {format_bytes(max(room, 0))} left",
                    quota="checkpoint_bytes", limit=limit, used=used + taken)
            yield chunk
    finally:
        close = getattr(export, "aclose", None)  # an async generator: its finally stops the export
        if close is not None:
            await close()
