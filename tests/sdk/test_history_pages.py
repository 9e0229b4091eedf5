"""The SDK's ``history()`` follows the server's pages (``next``) to the last: a sandbox's whole
timeline, as before the server answered in pages."""

from __future__ import annotations

from typing import Any

from hutch import history


class Pages:
    """A connection whose history route answers three pages of two steps."""

    def __init__(self) -> None:
        self.asked: list[dict[str, str]] = []
        self.connection = self

    async def request(self, method: str, path: str, *, params: dict[str, str] | None = None,
                      sandbox_id: str | None = None) -> dict[str, Any]:
        assert (method, path, sandbox_id) == ("GET", "/sandbox/sandboxes/sbx_1/history", "sbx_1")
        self.asked.append(dict(params or {}))
        after = int((params or {}).get("after", 0))
        steps = [{"position": p} for p in (after + 1, after + 2)]
        return {"data": {"history": steps, "next": steps[-1]["position"] if after < 4 else None}}

    def data(self, body: dict[str, Any]) -> Any:
        return body["data"]


async def test_history_reads_every_page() -> None:
    conn = Pages()
    steps = await history.history(conn, "sbx_1")  # type: ignore[arg-type]
    assert [s["position"] for s in steps] == [1, 2, 3, 4, 5, 6]
    assert conn.asked == [{}, {"after": "2"}, {"after": "4"}]
