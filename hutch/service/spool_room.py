"""What an organization's transfers hold in the server's temporary files at once.

An archive upload (``POST /fs/upload``) is spooled whole before its members are checked, and
an SFTP file is fetched whole when opened and collected whole until closed: each up to the
server's upload limit (``max_upload_bytes``, 4 GiB), in the data directory's spool
(service/files.py), outside every sandbox's disk limit and every storage quota. Each was
bounded alone, never together: a tenant opening a sandbox's 4 GiB sparse file (free to make)
over SFTP a hundred times, or sending a hundred uploads at once, had the server write 400 GiB.

Now an organization's spooled bytes on this server are at most ``per_org`` together (the
upload limit: one largest transfer, or many smaller ones); past it a transfer is refused,
naming the bound, until others end. Counted as the bytes arrive, given back when the spool
is dropped.
"""

from __future__ import annotations

from hutch.core.errors import RateLimited
from hutch.core.quantities import format_bytes


class SpoolRoom:
    def __init__(self, per_org: int) -> None:
        self.per_org = per_org
        self._held: dict[str, int] = {}

    def held(self, org_id: str | None) -> int:
        return self._held.get(org_id or "", 0)

    def take(self, org_id: str | None, size: int) -> None:
        """``size`` more bytes spooled for the organization; refused (nothing taken) past its room."""
        key = org_id or ""
        held = self._held.get(key, 0)
        if size > 0 and held + size > self.per_org:
            raise RateLimited(
                f"transfers at once: organization {org_id} holds {format_bytes(held)} of uploads and SFTP files "
                f"in the server's temporary files, and this one would pass the {format_bytes(self.per_org)} it may "
                "(max_upload_bytes); finish or close some and retry", retry_after=1, close=True)
        if size > 0:
            self._held[key] = held + size

    def give(self, org_id: str | None, size: int) -> None:
        key = org_id or ""
        left = self._held.get(key, 0) - size
        if left > 0:
            self._held[key] = left
        else:
            self._held.pop(key, None)


class Spooled:
    """One transfer's bytes in the organization's room."""

    def __init__(self, room: SpoolRoom, org_id: str | None, directory: str | None = None) -> None:
        self._room, self._org, self.size = room, org_id, 0
        self.directory = directory  # where its bytes go (None: the system's temporary directory)

    def grow_to(self, size: int) -> None:
        if size > self.size:
            self._room.take(self._org, size - self.size)
            self.size = size

    def release(self) -> None:
        self._room.give(self._org, self.size)
        self.size = 0
