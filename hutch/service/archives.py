"""Archives in and out of a sandbox, built on the driver's file primitives (its ``files``
role) or, where its capabilities say it offers them, its whole-tree tar streams (``trees``: one
round trip instead of one per file); so these take the driver by role (``DriverRoles``).

Downloads walk the tree with ``list_files`` and stream each file with ``read_file``
(drivers/trees.py, which a driver may use to play ``trees`` itself) into a tar.gz or zip
written on the fly, so memory stays flat whatever the size.

Uploads are spooled to a temporary file on disk (zip needs to seek, and spooling lets us
check every member *before* writing anything: an archive with one bad member writes
nothing). Refused: absolute names, ``..`` components, links whose
target leaves the destination (followed through the archive's other links, as the kernel
will), members written through a link of the archive, hard links, device nodes and fifos, and archives whose
unpacked size or entry count passes the configured limits.
"""

from __future__ import annotations

import asyncio
import contextlib
import posixpath
import queue
import stat
import tarfile
import tempfile
import threading
import time
import zipfile
import zlib
from collections.abc import AsyncIterable, AsyncIterator, Callable
from typing import IO, Any

import attrs

from hutch.core.errors import InvalidInput, PayloadTooLarge
from hutch.drivers import trees
from hutch.drivers.base import DriverRoles

FORMATS = ("tar.gz", "zip", "tar")
_CHUNK = 256 * 1024


# ---------------------------------------------------------------- download


class _Sink:
    """A write-only file object whose bytes are collected for the async side to send."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.offset = 0

    def write(self, data: bytes) -> int:
        if data:
            self.parts.append(bytes(data))
            self.offset += len(data)
        return len(data)

    def tell(self) -> int:
        return self.offset

    def flush(self) -> None:
        pass

    def take(self) -> bytes:
        out, self.parts = b"".join(self.parts), []
        return out


def export_bound(limits: Limits) -> int:
    """How much of a sandbox's tar the server reads for an archive that must unpack to at most
    ``limits.max_bytes``: that and room for the tar's own headers and padding (an eighth and
    2 MiB: at the default 4 GiB, ~1 KiB for each of 500,000 entries, past the 100,000 allowed).
    A sparse file is as large as a sandbox likes in a tar and costs it nothing: without a
    bound, the server read and compressed all of it before the unpacked size was checked."""
    return limits.max_bytes + limits.max_bytes // 8 + 2 * 2**20


async def tar_gz(driver: DriverRoles, sandbox_id: str, root: str, *, compress: bool = True,
                 max_bytes: int | None = None, watch: Callable[[bytes], None] | None = None,
                 ) -> AsyncIterator[bytes]:
    """The tar (gzipped unless ``compress`` is False) of ``root`` in the sandbox; with
    ``max_bytes``, PayloadTooLarge the moment the tar itself passes it (``export_bound``).
    ``watch`` sees the tar's bytes before they go on; what it raises stops the export."""
    gz = zlib.compressobj(6, zlib.DEFLATED, 31) if compress else None
    taken = 0

    def out(data: bytes) -> bytes:
        nonlocal taken
        taken += len(data)
        if max_bytes is not None and taken > max_bytes:
            raise PayloadTooLarge(f"archive: the sandbox's files come to more than {max_bytes} bytes of tar",
                                  field="archive")
        if watch is not None:
            watch(data)
        return gz.compress(data) if gz is not None else data

    if driver.capabilities.tar_streams:  # one stream instead of a round trip per file
        export = driver.trees.export_tar(sandbox_id, root)
        try:
            async for chunk in export:
                yield out(chunk)
        finally:
            close = getattr(export, "aclose", None)  # an export cut short stops its command
            if close is not None:
                await close()
        if gz is not None:
            yield gz.flush()
        return
    async for chunk in trees.tar_from_files(driver.files, sandbox_id, root):
        yield out(chunk)
    if gz is not None:
        yield gz.flush()


async def zip_stream(driver: DriverRoles, sandbox_id: str, root: str) -> AsyncIterator[bytes]:
    sink = _Sink()
    with zipfile.ZipFile(sink, "w", compression=zipfile.ZIP_DEFLATED) as zf:  # type: ignore[call-overload]  # _Sink: write/tell/flush, all "w" needs
        async for entry in trees.walk(driver.files, sandbox_id, root):
            when = time.gmtime(max(entry.mtime, 315532800))[:6]  # zip cannot say before 1980
            if entry.is_dir:
                zi = zipfile.ZipInfo(entry.rel + "/", when)
                zi.external_attr = (stat.S_IFDIR | stat.S_IMODE(entry.mode)) << 16
                zf.writestr(zi, b"")
            elif entry.link_target is not None:
                zi = zipfile.ZipInfo(entry.rel, when)
                zi.external_attr = (stat.S_IFLNK | 0o777) << 16
                zf.writestr(zi, entry.link_target)
            else:
                zi = zipfile.ZipInfo(entry.rel, when)
                zi.external_attr = (stat.S_IFREG | stat.S_IMODE(entry.mode)) << 16
                zi.compress_type = zipfile.ZIP_DEFLATED
                with zf.open(zi, "w", force_zip64=True) as member:
                    async for chunk in trees.file_chunks(driver.files, sandbox_id, entry):
                        member.write(chunk)
                        if sink.offset and sink.parts:
                            yield sink.take()
            data = sink.take()
            if data:
                yield data
    data = sink.take()
    if data:
        yield data


# ---------------------------------------------------------------- upload


@attrs.frozen
class Member:
    name: str  # normalised, relative to the destination
    source: str  # the name as stored in the archive
    kind: str  # "file" | "dir" | "symlink"
    size: int = 0
    mode: int = 0o644
    target: str = ""


@attrs.frozen
class Limits:
    max_bytes: int = 4 * 2**30
    max_entries: int = 100_000


def _clean(name: str) -> str:
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        raise InvalidInput(f"archive: entry {name!r} is an absolute path; refused", field="archive")
    parts = [p for p in name.replace("\\", "/").split("/") if p not in ("", ".")]
    if ".." in parts:
        raise InvalidInput(f"archive: entry {name!r} climbs out with '..'; refused", field="archive")
    if "\0" in name:
        raise InvalidInput(f"archive: entry name {name!r} contains a NUL byte", field="archive")
    return "/".join(parts)


def _check_link(name: str, target: str) -> None:
    if not target or target.startswith("/"):
        raise InvalidInput(f"archive: link {name!r} points to {target!r}, outside the destination; refused", field="archive")
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(name), target))
    if resolved == ".." or resolved.startswith("../"):
        raise InvalidInput(f"archive: link {name!r} points to {target!r}, outside the destination; refused", field="archive")


_MAX_HOPS = 40  # links followed in one path, as Linux's own bound (past it: ELOOP, nothing written)
# Components walked for one archive's check (each an O(1) step, ~0.15 us): each directory of its
# members is walked once, so 100,000 directories 20 deep are 2,000,000. Past this (~3 s) the
# archive is refused rather than followed for hours (a string per step made 400 entries 1,000
# deep take 1.5 s: 100,000 of them, ten minutes).
_MAX_STEPS = 20_000_000
_TARGET = ""  # where a link's node keeps its target: never a component of a checked name

_Node = dict[str, Any]  # a component's children by name, and ``_TARGET`` when it is a link


def _inside(parts: list[str], tree: _Node, budget: list[int]) -> bool:
    """Whether the path of ``parts`` (relative to the destination) stays in it when each
    component is followed through the archive's own links (``tree``) as the kernel follows
    them. ``_check_link`` alone reads each target as written: with ``here -> .``, the link
    ``x/up -> ../here/..`` (the destination as written) is its parent, and a file named
    ``x/up/f`` was written there."""
    nodes: list[_Node | None] = [tree]  # the tree's node of each component walked (None: no link below)
    todo = parts[::-1]  # the components still to walk, the next one last
    hops = 0
    while todo:
        budget[0] -= 1
        if budget[0] < 0:
            raise InvalidInput("archive: its links take too many steps to follow; refused", field="archive")
        part = todo.pop()
        if part in ("", "."):
            continue
        if part == "..":
            if len(nodes) == 1:
                return False
            nodes.pop()
            continue
        top = nodes[-1]
        node = top.get(part) if top is not None else None
        if node is not None and _TARGET in node:
            hops += 1
            if hops > _MAX_HOPS:
                return True  # a loop: the kernel refuses it (ELOOP) and writes nothing through it
            target: str = node[_TARGET]
            if target.startswith("/"):
                return False
            todo.extend(reversed(target.split("/")))  # read from the link's own directory
            continue
        nodes.append(node)
    return True


def _check_through_links(members: list[Member]) -> None:
    """No member is written, and no link points, outside the destination by way of the
    archive's other links."""
    links = {m.name: m.target for m in members if m.kind == "symlink"}
    if not links:
        return
    if len(links) != sum(m.kind == "symlink" for m in members) or any(
            m.kind != "symlink" and m.name in links for m in members):
        raise InvalidInput("archive: a link's name is given twice; refused", field="archive")
    tree: _Node = {}
    for name, target in links.items():
        node = tree
        for part in name.split("/"):
            node = node.setdefault(part, {})
        node[_TARGET] = target
    budget = [_MAX_STEPS]
    plain: set[str] = set()  # directories walked, no link on the way
    for m in members:
        parent = posixpath.dirname(m.name)
        if parent and parent not in plain:
            # Through a link, a member's name would not say where it is written (nor a link's
            # where it is): no tar or zip tool writes one so, and none is followed.
            at: _Node | None = tree
            parts = parent.split("/")
            budget[0] -= len(parts)
            if budget[0] < 0:
                raise InvalidInput("archive: its links take too many steps to follow; refused", field="archive")
            for i, part in enumerate(parts):
                at = at.get(part) if at is not None else None
                if at is not None and _TARGET in at:
                    raise InvalidInput(f"archive: entry {m.name!r} passes through the archive's link "
                                       f"{'/'.join(parts[:i + 1])!r}; refused", field="archive")
            plain.add(parent)
        if m.kind == "symlink" and not _inside([*parent.split("/"), *m.target.split("/")], tree, budget):
            raise InvalidInput(f"archive: link {m.name!r} points to {m.target!r}, outside the destination by way of "
                               "the archive's other links; refused", field="archive")


def _tar_members(path: str, limits: Limits) -> list[Member]:
    members: list[Member] = []
    total = 0
    with tarfile.open(path, "r:*") as tf:
        for info in tf:
            if len(members) >= limits.max_entries:
                raise PayloadTooLarge(f"archive: more than {limits.max_entries} entries", field="archive")
            name = _clean(info.name)
            if not name:
                continue
            if info.isdir():
                members.append(Member(name, info.name, "dir", mode=stat.S_IMODE(info.mode) or 0o755))
            elif info.issym():
                _check_link(name, info.linkname)
                members.append(Member(name, info.name, "symlink", target=info.linkname))
            elif info.islnk():
                raise InvalidInput(f"archive: {name!r} is a hard link; hard links are not supported", field="archive")
            elif info.isreg():
                total += info.size
                if total > limits.max_bytes:
                    raise PayloadTooLarge(f"archive: unpacks to more than {limits.max_bytes} bytes", field="archive")
                members.append(Member(name, info.name, "file", size=info.size, mode=stat.S_IMODE(info.mode) or 0o644))
            else:
                raise InvalidInput(f"archive: {name!r} is a device, fifo or other special file; refused", field="archive")
    _check_through_links(members)
    return members


def checked_tar(path: str, members: list[Member]) -> AsyncIterator[bytes]:
    """The members ``check_tar`` passed, as a fresh uncompressed tar stream."""
    return _rewritten(path, members)


def check_tar(path: str, limits: Limits) -> list[Member]:
    """Every member of a tar (any compression) checked as an upload is: no absolute names,
    no ``..``, no links out, no devices, within the size and entry limits."""
    return _tar_members(path, limits)


def _zip_members(path: str, limits: Limits) -> list[Member]:
    members: list[Member] = []
    total = 0
    with zipfile.ZipFile(path) as zf:
        infos = zf.infolist()
        if len(infos) > limits.max_entries:
            raise PayloadTooLarge(f"archive: more than {limits.max_entries} entries", field="archive")
        for info in infos:
            name = _clean(info.filename)
            if not name:
                continue
            mode = info.external_attr >> 16
            if info.is_dir():
                members.append(Member(name, info.filename, "dir", mode=stat.S_IMODE(mode) or 0o755))
            elif stat.S_ISLNK(mode):
                target = zf.read(info).decode("utf-8", "replace")
                _check_link(name, target)
                members.append(Member(name, info.filename, "symlink", target=target))
            elif stat.S_IFMT(mode) not in (0, stat.S_IFREG):  # many zips carry no type bits at all
                raise InvalidInput(f"archive: {name!r} is a device, fifo or other special file; refused", field="archive")
            else:
                total += info.file_size
                if total > limits.max_bytes:
                    raise PayloadTooLarge(f"archive: unpacks to more than {limits.max_bytes} bytes", field="archive")
                members.append(Member(name, info.filename, "file", size=info.file_size, mode=stat.S_IMODE(mode) or 0o644))
    _check_through_links(members)
    return members


def detect_format(head: bytes) -> str:
    if head.startswith(b"\x1f\x8b"):
        return "tar.gz"
    if head.startswith(b"PK\x03\x04") or head.startswith(b"PK\x05\x06"):
        return "zip"
    if len(head) >= 262 and head[257:262] == b"ustar":
        return "tar"
    raise InvalidInput("archive: not a tar, tar.gz or zip archive (give ?format= if it is one)", field="format")


@attrs.frozen
class Extracted:
    files: int
    directories: int
    symlinks: int
    bytes: int


async def spool(body: AsyncIterable[bytes], max_bytes: int, directory: str | None = None) -> IO[bytes]:
    """The request body in a temporary file on disk (never all in memory), size-checked as it arrives."""
    tmp = tempfile.NamedTemporaryFile(dir=directory, prefix="upload-")  # noqa: SIM115 - the caller closes it
    size = 0
    try:
        async for chunk in body:
            size += len(chunk)
            if size > max_bytes:
                raise PayloadTooLarge(f"archive: larger than {max_bytes} bytes", field="archive")
            await asyncio.to_thread(tmp.write, chunk)
        await asyncio.to_thread(tmp.flush)
        tmp.seek(0)
        return tmp
    except BaseException:
        tmp.close()
        raise


async def extract(driver: DriverRoles, sandbox_id: str, dest: str, fmt: str | None, archive: IO[bytes], limits: Limits) -> Extracted:
    """Check every member first, then write them through the driver as the sandbox user."""
    head = archive.read(512)
    archive.seek(0)
    fmt = fmt or detect_format(head)
    if fmt not in FORMATS:
        raise InvalidInput(f"format: expected one of {', '.join(FORMATS)}, got {fmt!r}", field="format")
    path = archive.name  # spool() gives a named file
    try:
        members = await asyncio.to_thread(_zip_members if fmt == "zip" else _tar_members, path, limits)
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, zlib.error) as err:
        raise InvalidInput(f"archive: not a readable {fmt} archive ({err})", field="archive") from err
    if driver.capabilities.tar_streams and fmt != "zip":
        # The driver unpacks a tar written here from the checked members only, with the
        # directory modes the per-file path gives (a 0644 directory in an archive would
        # lock its own contents away).
        await driver.trees.import_tar(sandbox_id, dest, _rewritten(path, members), gzipped=False)
        kinds = [m.kind for m in members]
        return Extracted(files=kinds.count("file"), directories=kinds.count("dir"), symlinks=kinds.count("symlink"),
                         bytes=sum(m.size for m in members))
    await driver.files.mkdir(sandbox_id, dest, parents=True)
    counts = {"file": 0, "dir": 0, "symlink": 0}
    written = 0
    opener = zipfile.ZipFile(path) if fmt == "zip" else tarfile.open(path, "r:*")  # noqa: SIM115 - closed by the with below
    with opener as src:
        for m in members:
            target = posixpath.join(dest, m.name)
            counts[m.kind] += 1
            if m.kind != "file":
                await trees.write_member(driver.files, sandbox_id, target, m.kind, link=m.target)
                continue
            fh = src.open(m.source) if isinstance(src, zipfile.ZipFile) else src.extractfile(m.source)
            assert fh is not None
            with fh:
                written += await trees.write_member(driver.files, sandbox_id, target, "file", mode=m.mode,
                                                    chunks=_read_chunks(fh))
    return Extracted(files=counts["file"], directories=counts["dir"], symlinks=counts["symlink"], bytes=written)


async def _rewritten(path: str, members: list[Member]) -> AsyncIterator[bytes]:
    """The checked members of the tar at ``path`` as a fresh, uncompressed tar stream,
    written by a thread with backpressure (a bounded queue)."""
    wanted = {m.source: m for m in members}
    chunks: queue.Queue[bytes | BaseException | None] = queue.Queue(maxsize=8)
    stop = threading.Event()

    class _Pipe:
        def write(self, data: bytes) -> int:
            if stop.is_set():
                raise OSError("the reader went away")
            chunks.put(bytes(data))
            return len(data)

    def produce() -> None:
        try:
            with tarfile.open(path, "r:*") as src, \
                    tarfile.open(fileobj=_Pipe(), mode="w|", format=tarfile.PAX_FORMAT) as out:  # type: ignore[call-overload]
                for info in src:
                    m = wanted.get(info.name)
                    if m is None:
                        continue
                    new = tarfile.TarInfo(m.name)
                    new.mtime = info.mtime
                    if m.kind == "dir":
                        new.type, new.mode = tarfile.DIRTYPE, 0o755
                        out.addfile(new)
                    elif m.kind == "symlink":
                        new.type, new.linkname, new.mode = tarfile.SYMTYPE, m.target, 0o777
                        out.addfile(new)
                    else:
                        new.size, new.mode = m.size, m.mode
                        out.addfile(new, src.extractfile(info))
            chunks.put(None)
        except BaseException as err:
            chunks.put(err)

    worker = threading.Thread(target=produce, name="tar-rewrite", daemon=True)
    worker.start()
    try:
        while True:
            item = await asyncio.to_thread(chunks.get)
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        while worker.is_alive():  # unblock a producer waiting on a full queue
            with contextlib.suppress(queue.Empty):
                chunks.get_nowait()
            await asyncio.sleep(0.01)


async def _read_chunks(fh: IO[bytes]) -> AsyncIterator[bytes]:
    while chunk := await asyncio.to_thread(fh.read, _CHUNK):
        yield chunk
