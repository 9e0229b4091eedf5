"""edge/phases.py: both servers' edge times each request by its route and writes the spans
to the data dir when it stops (the node agent's with its prefix, so one bench tells them apart)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from hutch.core import phases
from hutch.edge import phases as edge_phases


@pytest.fixture
def phases_on(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(phases, "ON", True)
    phases.clear()
    yield
    phases.clear()


@pytest.mark.usefixtures("phases_on")
async def test_each_request_is_timed_by_its_route_and_written_at_the_stop(tmp_path: Path) -> None:
    async def hello(request: web.Request) -> web.Response:
        return web.Response(text="hi")

    app = web.Application(middlewares=[edge_phases.request_middleware("agent: ")])
    app.router.add_get("/v1/sandboxes/{id}", hello)
    app.cleanup_ctx.append(edge_phases.file_ctx(lambda app: tmp_path))
    async with TestClient(TestServer(app)) as client:
        for name in ("sbx_a", "sbx_b"):
            assert (await client.get(f"/v1/sandboxes/{name}")).status == 200
        assert (await client.get("/nowhere")).status == 404
        assert not (tmp_path / edge_phases.FILE).exists()
    written = json.loads((tmp_path / edge_phases.FILE).read_text())
    assert len(written["agent: request GET /v1/sandboxes/{id}"]) == 2
    assert len(written["agent: request GET /nowhere"]) == 1
