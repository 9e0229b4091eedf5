"""Time travel in the SDK: a sandbox's timeline, and the sandbox as of any of its events.

    steps = await history(client, sandbox_id)            # [{eventId, type, createdAt, status, …}]
    then = await as_of(client, sandbox_id, "evt_…")        # a get's fields + env + asOf
"""

from __future__ import annotations

from typing import Any

from hutch._connection import Connected, segment

__all__ = ["as_of", "history"]


async def history(client: Connected, sandbox_id: str) -> list[dict[str, Any]]:
    """Every event of the sandbox with its status right after it, oldest first (the server
    answers in pages: followed to the last)."""
    conn = client.connection
    steps: list[dict[str, Any]] = []
    params: dict[str, str] = {}
    while True:
        body = await conn.request("GET", f"/sandbox/sandboxes/{segment(sandbox_id)}/history", params=params,
                                  sandbox_id=sandbox_id)
        data = conn.data(body)
        steps += data["history"]
        if data.get("next") is None:
            return steps
        params = {"after": str(data["next"])}


async def as_of(client: Connected, sandbox_id: str, ref: str) -> dict[str, Any]:
    """The sandbox as it was right after event ``ref`` (``evt_…``) or at a time (ISO 8601)."""
    conn = client.connection
    body = await conn.request("GET", f"/sandbox/{segment(sandbox_id)}", params={"asOf": ref}, sandbox_id=sandbox_id)
    return dict(conn.data(body))
