"""Snapshots, served: take one from a sandbox, build one from an uploaded archive, seed new
sandboxes from one, tag, delete, walk lineage.

The content is the sandbox's workspace as a tar.gz, read and written through the driver's
file primitives (so it means the same under every driver that has them, and can never
reach past the sandbox's own view), kept in the blob store (``core.blobs``) as
``snapshots/<id>.tar.gz``: files under the data dir, or PostgreSQL in the production
profile, where every API replica reaches it. The metadata lives in the event log
(``core.snapshots``) and the projections.

Nothing is half-made: the archive is spooled to a local temporary file (so a slow store
never stalls the export from the sandbox), checked there, and put whole before the event
that makes the snapshot visible is appended; it is removed again if that append fails. A
deleted snapshot's archive goes after its deletion is logged.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import datetime as dt
import hashlib
import mimetypes
import stat
import tarfile
import zlib
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Callable
from pathlib import Path
from typing import IO

import attrs

from hutch.core import ids, runtimes
from hutch.core.blobs import BlobNotFound, BlobStore
from hutch.core.errors import (
    IllegalTransition,
    InvalidInput,
    NotSupported,
    PayloadTooLarge,
    QuotaExceeded,
    RuntimeNotFound,
    SnapshotNotFound,
)
from hutch.core.models import SnapshotFile, SnapshotState, SnapshotStatus
from hutch.core.packages import check_dependencies, check_packages
from hutch.core.quantities import format_bytes
from hutch.core.snapshots import (
    DEFAULT_TAG,
    BeginBuild,
    DeleteSnapshot,
    FilesTally,
    FinalizeBuild,
    Ref,
    TagSnapshot,
    TakeSnapshot,
    check_name,
    decide,
    parse_ref,
    record_bytes,
)
from hutch.core.tenancy import LOCAL_ORG, SCOPE, scoped_org, visible
from hutch.drivers.base import DriverRoles, ProvisionRequest
from hutch.projections.base import ProjectionStore, SnapshotQuery
from hutch.service import archives
from hutch.service.quotas import Quotas
from hutch.service.reads import Reads
from hutch.service.recorder import Recorder
from hutch.service.stream_ids import StreamIds
from hutch.service.tar_headers import GzipTarHeaders, TarHeaders
from hutch.service.timeouts import Reaper
from hutch.storage import spool

WORKSPACE = "."  # relative to the sandbox user's workspace (HOME), as the file API resolves it
LINEAGE_MAX = 1000
# A build not finalized within an hour is abandoned: deleted with its upload at the server's
# start, at every new build, and every BUILD_SWEEP_SECONDS (Engine.start); until then its
# upload counts against the organization's storage quota.
BUILD_TTL_SECONDS = 3600
BUILD_SWEEP_SECONDS = 600


class SnapshotArchives:
    """The archives in the blob store, one per snapshot, each complete or absent; local
    temporary copies (spooled before a put, fetched for a check or an unpack) in
    ``spool_dir``."""

    def __init__(self, store: BlobStore, spool_dir: Path) -> None:
        self.store = store
        self.spool_dir = spool_dir

    @staticmethod
    def key(snapshot_id: str) -> str:
        return f"snapshots/{snapshot_id}.tar.gz"

    async def spool(self, chunks: AsyncIterable[bytes], max_bytes: int | None = None) -> IO[bytes]:
        """``chunks`` in a local temporary file (size-checked as they arrive); the caller closes it."""
        await asyncio.to_thread(spool.private_dir, self.spool_dir)
        return await archives.spool(chunks, max_bytes if max_bytes is not None else 2**63, str(self.spool_dir))

    async def put(self, snapshot_id: str, spooled: IO[bytes]) -> None:
        await spool.put_file(self.store, self.key(snapshot_id), spooled)

    async def save(self, snapshot_id: str, chunks: AsyncIterable[bytes], max_bytes: int | None = None) -> None:
        with await self.spool(chunks, max_bytes) as spooled:
            await self.put(snapshot_id, spooled)

    async def fetch(self, snapshot_id: str) -> IO[bytes] | None:
        """The archive in a local temporary file, or None when there is none."""
        await asyncio.to_thread(spool.private_dir, self.spool_dir)
        try:
            return await spool.fetch(self.store, self.key(snapshot_id), self.spool_dir)
        except BlobNotFound:
            return None

    def read(self, snapshot_id: str) -> AsyncGenerator[bytes, None]:
        """The archive's bytes, streamed from the store (``BlobNotFound`` at the first step)."""
        return self.store.get(self.key(snapshot_id))

    async def exists(self, snapshot_id: str) -> bool:
        return await self.store.exists(self.key(snapshot_id))

    async def remove(self, snapshot_id: str) -> None:
        await self.store.delete(self.key(snapshot_id))


def snapshot_file(name: str, size: int, mode: int, sha256: str = "0" * 64) -> SnapshotFile:
    """A file of a snapshot's archive as its record lists it (its digest unknown as its
    header passes: one as long stands in)."""
    return SnapshotFile(path=name, size=size, sha256=sha256, mode=stat.S_IMODE(mode),
                        content_type=mimetypes.guess_type(name)[0] or "application/octet-stream")


class Tally:
    """A snapshot's archive reckoned from its tar headers as they pass (an export from a
    sandbox, a build's upload), refused at the file past what its record may list
    (``FilesTally``), past the per-snapshot limit, or past the organization's ``room`` left
    (``refuse``'s QUOTA_EXCEEDED, as the check after would answer), before the rest is read,
    spooled or stored: a full organization cost the server a whole 4.5 GiB export each time."""

    def __init__(self, limits: archives.Limits, room: int | None = None,
                 refuse: Callable[[int], Exception] | None = None) -> None:
        self.files = FilesTally()
        self._limits, self._room, self._refuse = limits, room, refuse

    def file(self, name: str, size: int, mode: int) -> None:
        files = self.files
        files.add(snapshot_file(name, size, mode))
        if files.size > self._limits.max_bytes:
            raise PayloadTooLarge(f"archive: unpacks to more than {self._limits.max_bytes} bytes", field="archive")
        stored = files.size + files.quota_record  # as Quotas.check_snapshot counts it after
        if self._room is not None and self._refuse is not None and stored > self._room:
            raise self._refuse(stored)

    def tar(self) -> TarHeaders:
        return TarHeaders(self.file)


async def _watched(chunks: AsyncIterable[bytes], feed: Callable[[bytes], None]) -> AsyncIterator[bytes]:
    async for chunk in chunks:
        feed(chunk)
        yield chunk


def scan(path: Path, limits: archives.Limits) -> tuple[SnapshotFile, ...]:
    """The regular files in a snapshot archive, after the same checks an upload gets (no
    ``..``, absolute names, links out, devices; sizes within limits; a list its record can
    hold)."""
    try:
        archives.check_tar(str(path), limits)
        out = []
        tally = FilesTally()
        with tarfile.open(path, "r:gz") as tar:
            for m in tar:
                if not m.isreg():
                    continue
                tally.add(snapshot_file(m.name.removeprefix("./"), m.size, m.mode))
                digest = hashlib.sha256()
                src = tar.extractfile(m)
                assert src is not None
                with src:
                    while block := src.read(1 << 20):
                        digest.update(block)
                name = m.name.removeprefix("./")
                out.append(SnapshotFile(
                    path=name, size=m.size, sha256=digest.hexdigest(), mode=stat.S_IMODE(m.mode),
                    content_type=mimetypes.guess_type(name)[0] or "application/octet-stream",
                ))
    except (tarfile.TarError, EOFError, zlib.error, OSError) as err:
        raise InvalidInput(f"archive: not a readable tar.gz archive ({err})", field="archive") from err
    return tuple(sorted(out, key=lambda f: f.path))


class Snapshots:
    def __init__(self, *, store: ProjectionStore, reads: Reads, recorder: Recorder, driver: DriverRoles, quotas: Quotas,
                 streams: StreamIds, reaper: Reaper, blobs: BlobStore, spool_dir: Path,
                 limits: archives.Limits) -> None:
        self._store = store
        self._reads = reads
        self._recorder = recorder
        self._driver = driver  # by role: the archive streams choose between files and trees
        self._quotas = quotas
        self._streams = streams
        self._reaper = reaper
        self.archives = SnapshotArchives(blobs, spool_dir)
        self.limits = limits

    def upload_token(self, snapshot_id: str) -> str:
        """What makes a snapshot's upload URL presigned: good for that snapshot only."""
        return self._streams.sign(f"snapshot-upload:{snapshot_id}")

    # ---------------------------------------------------------------- reads

    async def get(self, snapshot_id: str, *, include_building: bool = False, own: bool = False) -> SnapshotState:
        """A snapshot the request may see: its organization's, within the key's projects (one
        of no project: only by keys limited to none), or (unless ``own``, for changes) a public
        one. Any other is as absent as one that never existed."""
        snap = await self._store.get_snapshot(snapshot_id)
        if snap is None or snap.status is SnapshotStatus.DELETED or (
            snap.status is SnapshotStatus.BUILDING and not include_building
        ) or not (_mine(snap) or (snap.public and not own)):
            raise SnapshotNotFound(f"snapshot {snapshot_id} not found", snapshot_id=snapshot_id)
        return snap

    async def list(self, query: SnapshotQuery) -> tuple[builtins.list[SnapshotState], int]:
        """The request's organization's snapshots, within its key's projects (every
        organization's public ones when the query asks for public ones only)."""
        scope = SCOPE.get()
        if scope is not None and query.public is not True:
            query = attrs.evolve(query, org_id=scope.org_id, projects=scope.projects)
        return await self._store.list_snapshots(query)

    async def resolve(self, value: object, field: str = "snapshot", *, public_only: bool = False) -> SnapshotState:
        ref = parse_ref(value, field)
        snap = await self._find(ref, public_only)
        if snap is None:
            raise SnapshotNotFound(f"{field}: snapshot {value!r} not found (give an id snp_..., name:tag or a tag)",
                                   field=field)
        return snap

    async def _find(self, ref: Ref, public_only: bool) -> SnapshotState | None:
        public = True if public_only else None
        if ref.snapshot_id:
            snap = await self._store.get_snapshot(ref.snapshot_id)
            ok = snap is not None and snap.status is SnapshotStatus.READY and (
                snap.public or (not public_only and _mine(snap)))
            return snap if ok else None
        if ref.name:
            found, _ = await self.list(SnapshotQuery(name=ref.name, tag=ref.tag, public=public, limit=1))
            return found[0] if found else None
        for query in (SnapshotQuery(tag=ref.word, public=public, limit=1),
                      SnapshotQuery(name=ref.word, tag=DEFAULT_TAG, public=public, limit=1),
                      SnapshotQuery(name=ref.word, public=public, limit=1)):
            found, _ = await self.list(query)
            if found:
                return found[0]
        return None

    async def lineage(self, start: SnapshotState, limit: int) -> builtins.list[tuple[SnapshotState, bool]]:
        """``start`` and its ancestors, newest first, each with whether it was deleted."""
        chain: builtins.list[tuple[SnapshotState, bool]] = []
        seen: set[str] = set()
        snap: SnapshotState | None = start
        while snap is not None and len(chain) < limit and snap.snapshot_id not in seen and (
                snap.public or _mine(snap)):
            seen.add(snap.snapshot_id)
            chain.append((snap, snap.status is SnapshotStatus.DELETED))
            snap = await self._store.get_snapshot(snap.parent_snapshot_id) if snap.parent_snapshot_id else None
        return chain

    # ---------------------------------------------------------------- writes

    async def take(self, sandbox_id: str, *, name: str | None, description: str | None, tag: str | None,
                   public: bool, api_key_id: str | None, metadata: dict[str, str] | None = None) -> SnapshotState:
        """A snapshot of the sandbox's workspace, env and runtime, as they are now."""
        if not self._driver.capabilities.files:
            raise NotSupported(f"driver {self._driver.name} cannot read sandbox files, so cannot snapshot them")
        sb = await self._reads.wait_not_creating(sandbox_id)
        command = TakeSnapshot(
            source=sb, name=name if name is not None else _default_name(sb.spec.name, sandbox_id),
            tag=tag if tag is not None else DEFAULT_TAG, files=(), description=description, public=public,
            api_key_id=api_key_id, metadata=dict(metadata or {}))
        snapshot_id = ids.new_id("snapshot")
        decide(snapshot_id, None, command)  # refuses (an ended sandbox, a bad name or tag) before any work
        self._reaper.touch(sandbox_id)
        org_id = sb.spec.org_id
        room = await self._quotas.storage_room(org_id, allow_full=True)  # checked again, held, once read
        tally = Tally(self.limits, room, lambda size: self._quotas.past_room(org_id, room or 0, size))
        export = archives.tar_gz(self._driver, sandbox_id, WORKSPACE, max_bytes=archives.export_bound(self.limits),
                                 watch=tally.tar().feed)
        with await self.archives.spool(export) as spooled:
            files = await asyncio.to_thread(scan, Path(spooled.name), self.limits)
            async with self._quotas.storage_held(sb.spec.org_id):  # the check and its record, as one
                await self._quotas.check_snapshot(sb.spec.org_id, sum(f.size for f in files) + record_bytes(files))
                await self.archives.put(snapshot_id, spooled)
                try:
                    await self._recorder.snapshot(snapshot_id, attrs.evolve(command, files=files))
                except BaseException:
                    await self.archives.remove(snapshot_id)
                    raise
        await self._take_tag(snapshot_id, command.name, command.tag)
        return await self.get(snapshot_id)

    async def set_tag(self, snapshot_id: str, tag: str | None) -> SnapshotState:
        snap = await self.get(snapshot_id, own=True)
        await self._recorder.snapshot(snapshot_id, TagSnapshot(tag))
        if tag is not None:
            await self._take_tag(snapshot_id, snap.name, tag)
        return await self.get(snapshot_id)

    async def delete(self, snapshot_id: str) -> None:
        snap = await self._store.get_snapshot(snapshot_id)
        if snap is None or snap.status is SnapshotStatus.DELETED or not _mine(snap):
            raise SnapshotNotFound(f"snapshot {snapshot_id} not found", snapshot_id=snapshot_id)
        await self._recorder.snapshot(snapshot_id, DeleteSnapshot())
        await self.archives.remove(snapshot_id)

    async def expire_builds(self, older_than: float = BUILD_TTL_SECONDS) -> builtins.list[str]:
        """Builds never finalized within ``older_than`` seconds are deleted (logged, and their
        upload removed): a client that died mid-build leaves nothing behind for good."""
        cutoff = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=older_than)
        found, _ = await self.list(SnapshotQuery(ready_only=False, building_only=True, limit=10_000))
        expired = []
        for snap in found:
            if dt.datetime.fromisoformat(snap.created_at.replace("Z", "+00:00")) <= cutoff:
                with contextlib.suppress(SnapshotNotFound):  # deleted meanwhile
                    await self._recorder.snapshot(snap.snapshot_id, DeleteSnapshot())
                await self.archives.remove(snap.snapshot_id)
                expired.append(snap.snapshot_id)
        return expired

    async def build_init(self, *, runtime: str, name: str | None, tag: str | None, description: str | None,
                         message: str | None, content_hash: str | None, force: bool, public: bool,
                         api_key_id: str | None, project_id: str | None = None,
                         ) -> tuple[SnapshotState | None, SnapshotState | None]:
        """(the new building snapshot, None) or, unchanged content without force, (None, existing)."""
        recipe = runtimes.find(runtime)
        if recipe is None:
            known = ", ".join(r.name for r in runtimes.CATALOG)
            raise RuntimeNotFound(f"runtime: unknown runtime {runtime!r}; known runtimes: {known}", field="runtime")
        command = BeginBuild(
            name=name if name is not None else recipe.name.replace(":", "-").replace(".", "_"), runtime=recipe.name,
            runtime_id=recipe.id, tag=tag if tag is not None else DEFAULT_TAG, org_id=scoped_org() or LOCAL_ORG,
            description=description, message=message, public=public, content_hash=content_hash,
            api_key_id=api_key_id, project_id=project_id)
        snapshot_id = ids.new_id("snapshot")
        decide(snapshot_id, None, command)  # a bad name, tag or hash is refused before anything is looked up
        if content_hash and not force:
            found, _ = await self.list(SnapshotQuery(name=command.name, content_hash=content_hash, limit=1))
            if found:
                return None, found[0]
        await self.expire_builds()  # lazily: every new build clears out abandoned ones
        await self._recorder.snapshot(snapshot_id, command)
        return await self.get(snapshot_id, include_building=True), None

    async def upload(self, snapshot_id: str, body: AsyncIterable[bytes], max_bytes: int,
                     declared: int | None = None) -> SnapshotState:
        """Store a build's archive (``max_bytes`` at most). Counted against the organization's
        storage quota from its first byte; refused with QUOTA_EXCEEDED before any byte is
        stored when the organization has no room left (or ``declared``, its Content-Length,
        is more than the room), and the moment it passes the room."""
        snap = await self.get(snapshot_id, include_building=True, own=True)
        if snap.status is not SnapshotStatus.BUILDING:
            raise IllegalTransition(f"snapshot {snapshot_id} is {snap.status.value}; its content cannot change",
                                    snapshot_id=snapshot_id)
        # The room is reckoned and taken by one upload at a time (of an organization with a
        # storage quota): reckoned at each one's start, four at once each took all of it.
        async with self._quotas.storage_held(snap.org_id):
            room = await self._quotas.storage_room(snap.org_id, replacing=snapshot_id)
            if room is not None and declared is not None and declared > room:
                raise QuotaExceeded(f"quota snapshot_bytes: this upload is {format_bytes(declared)} and organization "
                                    f"{snap.org_id} may store {format_bytes(room)} more", quota="snapshot_bytes",
                                    limit=self._quotas.of(snap.org_id).snapshot_bytes, used=declared)
            # Refused at the entry past the record's, the snapshot's or the organization's room:
            # a small upload can declare (and inflate to) far more than it sends.
            tally = Tally(self.limits, room, lambda size: self._quotas.past_room(snap.org_id, room or 0, size))
            watch = GzipTarHeaders(tally.tar())
            await self.archives.save(snapshot_id, _watched(self._quotas.metered(snap.org_id, snapshot_id, body, room),
                                                           watch.feed), max_bytes)
        return snap

    async def finalize(self, snapshot_id: str, *, env: dict[str, str], metadata: dict[str, str],
                       dependencies: object, packages: object) -> SnapshotState:
        snap = await self.get(snapshot_id, include_building=True, own=True)
        decide(snapshot_id, snap, FinalizeBuild(files=()))  # a ready one is refused before anything is installed
        deps, pkgs = check_dependencies(dependencies), check_packages(packages)
        if deps or pkgs:
            # Installed now (and cached), so a bad package fails the build, not every create.
            driver = self._driver
            if not driver.capabilities.installs:
                field = "dependencies" if deps else "packages"
                raise NotSupported(f"{field}: driver {driver.name} cannot install dependencies or packages yet",
                                   field=field)
            await driver.runtimes.prepare(ProvisionRequest(sandbox_id=snapshot_id, runtime=snap.runtime,
                                                  dependencies=deps, packages=pkgs))
        spooled = await self.archives.fetch(snapshot_id)
        if spooled is not None:
            with spooled:
                files = await asyncio.to_thread(scan, Path(spooled.name), self.limits)
        else:
            if not (env or deps or pkgs):
                raise InvalidInput(f"snapshot {snapshot_id}: no archive was uploaded (PUT /sandbox/snapshots/"
                                   f"{snapshot_id}/upload) and there is no env, dependency or package to keep",
                                   field="archive")
            files = ()
        async with self._quotas.storage_held(snap.org_id):  # the check and its record, as one
            await self._quotas.check_snapshot(snap.org_id, sum(f.size for f in files) + record_bytes(files),
                                              finalizing=snapshot_id)
            await self._recorder.snapshot(snapshot_id, FinalizeBuild(files=files, env=env, metadata=metadata,
                                                                     dependencies=deps, packages=pkgs))
        await self._take_tag(snapshot_id, snap.name, snap.tag)
        return await self.get(snapshot_id)

    async def seed(self, sandbox_id: str, snapshot_id: str) -> None:
        """Unpack a snapshot's workspace into a sandbox being created (through the driver, as
        its user, with the upload checks)."""
        snap = await self.get(snapshot_id)
        fh = await self.archives.fetch(snapshot_id)
        if fh is None:
            if snap.file_count == 0:
                return  # an env-only build: nothing to unpack
            raise SnapshotNotFound(f"snapshot {snapshot_id}: its archive is gone (deleted meanwhile?)")
        with fh:
            await archives.extract(self._driver, sandbox_id, WORKSPACE, "tar.gz", fh, self.limits)

    # ---------------------------------------------------------------- helpers

    async def _take_tag(self, snapshot_id: str, name: str, tag: str | None) -> None:
        """A name:tag names one snapshot of a project (or of the organization, for those of
        none): the one that just took it; older holders there lose it. Another project's keep
        theirs: a key limited to one project changes nothing of another's."""
        if tag is None:
            return
        snap = await self._store.get_snapshot(snapshot_id) or _NO_SNAPSHOT
        others, _ = await self._store.list_snapshots(
            SnapshotQuery(org_id=snap.org_id, name=name, tag=tag, ready_only=False, limit=1000))
        for other in others:
            if other.snapshot_id != snapshot_id and other.project_id == snap.project_id:
                with contextlib.suppress(SnapshotNotFound):  # deleted meanwhile
                    await self._recorder.snapshot(other.snapshot_id, TagSnapshot(None))


_NO_SNAPSHOT = SnapshotState(snapshot_id="", name="", runtime="", runtime_id="", status=SnapshotStatus.DELETED,
                        created_at="", updated_at="")


def _mine(snap: SnapshotState) -> bool:
    """Whether the request may see (and change) the snapshot as its own: its organization's,
    and its project one of the key's (a key limited to projects sees none of no project)."""
    return visible(snap.org_id, snap.project_id)


def _default_name(sandbox_name: str | None, sandbox_id: str) -> str:
    if sandbox_name:
        with contextlib.suppress(InvalidInput):
            return check_name(sandbox_name)
    return sandbox_id


def unchanged(snap: SnapshotState) -> dict[str, object]:
    return {"unchanged": True, "existingId": snap.snapshot_id, "existingName": snap.name,
            "existingTag": snap.tag}

