"""The blocking facade runs the async client on its own loop thread."""

from __future__ import annotations

import io

import pytest

from hutch import SyncSandboxClient, errors
from tests.sdk.fakewire import KEY, Script, Step, ThreadedServer


@pytest.fixture
def server():  # type: ignore[no-untyped-def]
    with ThreadedServer() as s:
        yield s


def test_sync_run_create_execute(server: ThreadedServer) -> None:
    server.wire.script = lambda argv: Script(
        [Step("stdout", b"out"), Step("stderr", b"err")], exit_code=2
    )
    out = io.StringIO()
    with SyncSandboxClient(server.url, api_key=KEY) as client:
        result = client.run(["x"], runtime="base:latest", stdout=out)
        assert (result.exit_code, result.stdout, result.stderr) == (2, "out", "err")
        assert out.getvalue() == "out"

        with client.create(name="s") as sandbox:
            execution = sandbox.execute(["y"])
            assert execution.exit_code == 2
            assert execution.stdout == "out"
            handle = sandbox.start(["z"])
            assert [c.data for c in handle.output()] == [b"out", b"err"]
            assert handle.wait().exit_code == 2
            assert sandbox.get().executions == 2
            assert [s.sandbox_id for s in client.iter_sandboxes(page_size=1)] == [
                s["sandboxId"] for s in server.wire.sandboxes.values()
            ]
        assert server.wire.sandboxes[sandbox.id]["status"] == "terminated"
        assert [e.type for e in client.list_events(sandbox.id)] == ["create", "destroy"]


def test_sync_errors_propagate(server: ThreadedServer) -> None:
    with (
        SyncSandboxClient(server.url, api_key=KEY) as client,
        pytest.raises(errors.SandboxNotFound),
    ):
        client.get("sbx_nope")


def test_sync_closed_client_refuses_calls(server: ThreadedServer) -> None:
    client = SyncSandboxClient(server.url, api_key=KEY)
    client.close()
    with pytest.raises(RuntimeError, match="closed"):
        client.list()
