"""The SDK end to end against the real hutch application (fake driver), in process."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from hutch import SandboxClient, errors
from hutch.api.app import create_app
from hutch.service.config import Config


@pytest.fixture
async def live(aiohttp_server, tmp_path: Path) -> AsyncIterator[SandboxClient]:  # type: ignore[no-untyped-def]
    server = await aiohttp_server(create_app(Config(driver="fake", data_dir=tmp_path, api_key="k")))
    async with SandboxClient(str(server.make_url("")), api_key="k") as client:
        yield client


async def test_run_one_shot(live: SandboxClient) -> None:
    chunks: list[bytes] = []
    result = await live.run(
        ["sh", "-c", "echo out; echo err >&2; exit 3"], runtime="base:latest", stdout=chunks.append
    )
    assert result.exit_code == 3
    assert result.stdout == "out\n"
    assert result.stderr == "err\n"
    assert b"".join(chunks) == b"out\n"
    # A one-shot sandbox ends itself once its command exits (shortly after, not necessarily before).
    info = await live.get(result.sandbox_id, wait_for_status="terminated", wait_ms=5000)
    assert info.mode == "oneshot"
    assert info.status == "terminated"


async def test_run_writes_files_and_env(live: SandboxClient) -> None:
    result = await live.run(["env"], env={"GREETING": "hi"}, files={"a.txt": "A"})
    assert result.exit_code == 0
    assert "GREETING=hi" in result.stdout
    # Let the one-shot finish terminating before the server shuts down: closing the app while
    # its termination events land can hang the projector's shutdown (reported to the server side).
    await live.get(result.sandbox_id, wait_for_status="terminated", wait_ms=5000)


async def test_create_execute_list_events_destroy(live: SandboxClient) -> None:
    async with await live.create(name="dev", resources={"memory": "256Mi"}) as sandbox:
        first = await sandbox.execute(["echo", "hello"])
        assert (first.status, first.exit_code, first.stdout) == ("completed", 0, "hello\n")
        failing = await sandbox.execute(["sh", "-c", "echo nope >&2; exit 4"])
        assert (failing.exit_code, failing.stderr) == (4, "nope\n")

        handle = await sandbox.start(["echo", "streamed"])
        assert [c.data async for c in handle.output()] == [b"streamed\n"]
        assert (await handle.wait()).exit_code == 0

        page = await live.list(name="dev")
        assert [s.sandbox_id for s in page.sandboxes] == [sandbox.id]
        assert page.total == 1
        info = await sandbox.get()
        assert info.executions == 3
        assert info.resources is not None
        assert info.resources.memory == "256Mi"

        executions = await live.list_executions(sandbox.id)  # the wire does not fix an order
        by_command = {tuple(x.command or ()): x for x in executions}
        assert set(by_command) == {
            ("echo", "hello"),
            ("sh", "-c", "echo nope >&2; exit 4"),
            ("echo", "streamed"),
        }
        fetched = await live.get_execution(failing.execution_id, wait="1s")
        assert fetched.exit_code == 4
        assert fetched == by_command[("sh", "-c", "echo nope >&2; exit 4")]

    events = await live.list_events(sandbox.id)
    types = [e.type for e in events]
    assert types[0] == "create"
    assert "destroy" in types
    newest_first = await live.list_events(sandbox.id, direction="desc", limit=1)
    assert newest_first[0].event_id == events[-1].event_id

    with pytest.raises(errors.SandboxNotFound):
        await sandbox.execute(["echo"])


async def test_runtimes_and_errors(live: SandboxClient) -> None:
    runtimes = await live.list_runtimes()
    assert "base:latest" in {r.name for r in runtimes.runtimes}
    with pytest.raises(errors.NotFound) as info:
        await live.get("sbx_missing")
    assert info.value.status == 404
    with pytest.raises(errors.InvalidInput) as bad:
        await live.create(resources={"memory": "lots"})
    assert bad.value.status == 400
    assert "memory" in bad.value.message
    live.api_key = "wrong"
    with pytest.raises(errors.Unauthorized):
        await live.list()


async def test_update_network_through_the_sdk(live: SandboxClient) -> None:
    """The fake driver keeps the rules without enforcing them (it has no network): what is
    checked here is the SDK's call and answer; the local driver's enforcement is held in
    tests/adversarial/test_local_egress_rules.py."""
    async with await live.create(runtime="base:latest") as sandbox:
        with pytest.raises(errors.NotSupported) as refused:
            await sandbox.update_network(enabled=True)
        assert refused.value.status == 501 and "made without outbound network" in refused.value.message
        with pytest.raises(errors.InvalidInput) as bad:
            await sandbox.update_network(enabled=True, allow=["192.0.2.7"], deny=["192.0.2.0/24"])
        assert bad.value.field == "network.deny"
        info = await sandbox.update_network(enabled=False)
        assert (info.sandbox_id, info.network_enabled, info.network_allow, info.network_deny) == (
            sandbox.id, False, None, None)
        assert (await live.update_network(sandbox.id, enabled=False)).network_enabled is False
        types = [e.type for e in await sandbox.list_events()]
        assert types.count("network") == 2
