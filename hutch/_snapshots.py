"""Checkpoints, snapshots and usage stats over a :class:`~hutch._connection.Connection`:
saving and restoring a sandbox's files in place, and named, tagged snapshots new sandboxes
start from (made from a sandbox, or built from a runtime and a workspace archive). (The public
docs are on :class:`hutch.client.SandboxClient`, which delegates here.)"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import IO, Any

from hutch import _transfer
from hutch._connection import Connection, items, segment
from hutch._files import save_to
from hutch.models import Checkpoint, Snapshot, SnapshotLineageEntry, from_wire


class Snapshots:
    """Checkpoints, snapshots and stats."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection

    async def create_checkpoint(self, sandbox_id: str, name: str) -> Checkpoint:
        resp = await self.connection.request(
            "POST", f"/sandbox/{segment(sandbox_id)}/checkpoint", json={"name": name}, sandbox_id=sandbox_id
        )
        return from_wire(Checkpoint, self.connection.data(resp))

    async def list_checkpoints(self, sandbox_id: str) -> list[Checkpoint]:
        resp = await self.connection.request("GET", f"/sandbox/checkpoints/{segment(sandbox_id)}", sandbox_id=sandbox_id)
        return [from_wire(Checkpoint, item) for item in items(self.connection.data(resp), "checkpoints")]

    async def restore_checkpoint(self, sandbox_id: str, checkpoint_id: str) -> None:
        await self.connection.request(
            "POST", f"/sandbox/{segment(sandbox_id)}/checkpoint/{segment(checkpoint_id)}/restore", sandbox_id=sandbox_id
        )

    async def delete_checkpoint(self, sandbox_id: str, checkpoint_id: str) -> None:
        await self.connection.request(
            "DELETE", f"/sandbox/{segment(sandbox_id)}/checkpoint/{segment(checkpoint_id)}", sandbox_id=sandbox_id
        )

    # ---------------------------------------------------------------- snapshots

    async def create_snapshot(
        self,
        sandbox_id: str,
        *,
        name: str | None = None,
        tag: str | None = None,
        description: str | None = None,
        public: bool | None = None,
    ) -> Snapshot:
        body = {"name": name, "tag": tag, "description": description, "public": public}
        resp = await self.connection.request(
            "POST", f"/sandbox/{segment(sandbox_id)}/snapshot",
            json={k: v for k, v in body.items() if v is not None}, sandbox_id=sandbox_id,
        )
        return from_wire(Snapshot, self.connection.data(resp))

    async def get_snapshot(self, snapshot: str) -> Snapshot:
        resp = await self.connection.request("GET", f"/sandbox/snapshots/{segment(snapshot)}")
        return from_wire(Snapshot, self.connection.data(resp))

    async def list_snapshots(
        self,
        *,
        sandbox_id: str | None = None,
        limit: int | None = None,
        offset: int | None = None,
        sort: str | None = None,
        direction: str | None = None,
        forks: bool = False,
    ) -> tuple[list[Snapshot], int]:
        resp = await self.connection.request("GET", "/sandbox/snapshots", params={
            "sandboxId": sandbox_id, "limit": limit, "offset": offset, "sort": sort, "direction": direction,
            "forks": True if forks else None})
        data = self.connection.data(resp)
        return [from_wire(Snapshot, item) for item in items(data, "snapshots")], int(data.get("total", 0))

    async def tag_snapshot(self, snapshot_id: str, tag: str | None) -> Snapshot:
        resp = await self.connection.request("PATCH", f"/sandbox/snapshots/{segment(snapshot_id)}", json={"tag": tag})
        return from_wire(Snapshot, self.connection.data(resp))

    async def delete_snapshot(self, snapshot_id: str) -> None:
        await self.connection.request("DELETE", f"/sandbox/snapshots/{segment(snapshot_id)}")

    async def snapshot_lineage(
        self, *, snapshot: str | None = None, name: str | None = None, tag: str | None = None,
        limit: int | None = None,
    ) -> list[SnapshotLineageEntry]:
        resp = await self.connection.request("GET", "/sandbox/snapshots/lineage", params={
            "snapshot": snapshot, "name": name, "tag": tag, "limit": limit})
        return [from_wire(SnapshotLineageEntry, item) for item in items(self.connection.data(resp), "lineage")]

    async def download_snapshot(self, snapshot_id: str, dest: str | os.PathLike[str] | IO[bytes]) -> int:
        async def chunks() -> AsyncIterator[bytes]:
            async with self.connection.raw("GET", f"/sandbox/snapshots/{segment(snapshot_id)}/download") as resp:
                async for chunk in resp.content.iter_chunked(1 << 20):
                    yield chunk

        return await save_to(chunks(), dest)

    async def build_snapshot(
        self,
        runtime: str,
        archive: _transfer.Source | None,
        *,
        name: str | None = None,
        tag: str | None = None,
        description: str | None = None,
        message: str | None = None,
        content_hash: str | None = None,
        force: bool = False,
        public: bool = False,
        env: Mapping[str, str] | None = None,
        metadata: Mapping[str, str] | None = None,
        dependencies: Sequence[str] = (),
        packages: Sequence[str] = (),
        progress: Callable[[str], None] | None = None,
    ) -> tuple[Snapshot, bool]:
        body: dict[str, Any] = {"runtime": runtime, "name": name, "tag": tag, "description": description,
                                "message": message, "contentHash": content_hash, "force": force or None,
                                "public": public}
        resp = await self.connection.request("POST", "/sandbox/snapshots/build",
                                   json={k: v for k, v in body.items() if v is not None})
        init = self.connection.data(resp)
        say = progress or (lambda _m: None)
        if init.get("unchanged"):
            say(f"unchanged: {init.get('existingId')} has this content already")
            return await self.get_snapshot(str(init["existingId"])), False
        snapshot_id = str(init["snapshotId"])
        say(f"build {snapshot_id} started")
        if archive is not None:
            say("uploading the archive")
            async with self.connection.raw("PUT", f"/sandbox/snapshots/{segment(snapshot_id)}/upload",
                                 data=_transfer.source_chunks(archive),
                                 headers={"Content-Type": "application/gzip"}) as upload:
                await upload.read()
        say("finalizing" + (" (installing dependencies and packages)" if dependencies or packages else ""))
        resp = await self.connection.request("POST", f"/sandbox/snapshots/{segment(snapshot_id)}/finalize", max_seconds=1800, json={
            "sizeBytes": 0, "fileCount": 0, "files": [], "env": dict(env or {}), "metadata": dict(metadata or {}),
            "dependencies": list(dependencies), "packages": list(packages)})
        return from_wire(Snapshot, self.connection.data(resp)), True

    async def stats(self, *, start: str | None = None, end: str | None = None) -> dict[str, Any]:
        resp = await self.connection.request("GET", "/sandbox/stats", params={"start": start, "end": end})
        data = self.connection.data(resp)
        return dict(data) if isinstance(data, dict) else {}
