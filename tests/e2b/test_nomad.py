"""E2B's file metadata, directory watches and metrics on the nomad driver (the Nomad dev agent
of ``./scripts/services start nomad``; a missing one fails the server's start), with the real
``e2b`` SDK. The rest of the E2B wire reaches drivers only through the engine and runs on the
local driver (tests/e2b/conftest.py); these are the nomad driver's own work
(drivers/nomad/helpers.py and usage.py; update_network: the plugin's egress verb)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest
from e2b import FilesystemEventType, Sandbox
from e2b.exceptions import SandboxException

from tests.drivers_support import plugin_reads_page_cache
from tests.e2b.conftest import E2bServer, _serve
from tests.e2b.test_sdk import (
    test_a_sandbox_to_pause_at_its_timeout_pauses_then_with_its_command_frozen,
)
from tests.system.server import KEY

# E2B's autoPause with a command running, on nomad too (issue 36: the nomad driver refused a
# pause with commands running, so such a sandbox ran on past its timeout for as long as they
# did): test_sdk.py's test, here against this module's nomad server.
__all__ = ["test_a_sandbox_to_pause_at_its_timeout_pauses_then_with_its_command_frozen"]


@pytest.fixture(scope="module")
def nomad_e2b(tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2bServer]:
    for served in _serve(tmp_path_factory, driver="nomad"):
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("E2B_API_URL", served.url)
            mp.setenv("E2B_SANDBOX_URL", served.url)
            mp.setenv("E2B_API_KEY", KEY)
            mp.delenv("E2B_DEBUG", raising=False)
            mp.delenv("E2B_DOMAIN", raising=False)
            yield served


@pytest.fixture(scope="module")
def e2b_env(nomad_e2b: E2bServer) -> E2bServer:
    """test_sdk.py's tests taken in here run against the nomad server."""
    return nomad_e2b


@pytest.fixture(scope="module")
def sandbox(nomad_e2b: E2bServer) -> Iterator[Sandbox]:
    sbx = Sandbox.create(timeout=300)
    yield sbx
    sbx.kill()


def test_metadata_is_kept_listed_moved_and_cleared_by_an_overwrite(sandbox: Sandbox) -> None:
    info = sandbox.files.write("meta/a.txt", "x", metadata={"Author": "ann", "purpose": "test"})
    assert info.metadata == {"author": "ann", "purpose": "test"}
    assert sandbox.files.get_info("meta/a.txt").metadata == info.metadata
    assert [e.metadata for e in sandbox.files.list("meta")] == [info.metadata]
    assert sandbox.files.rename("meta/a.txt", "meta/b.txt").metadata == info.metadata
    assert sandbox.files.write("meta/b.txt", "y").metadata is None
    assert sandbox.files.get_info("meta/b.txt").metadata is None


def test_a_watch_reports_each_change_made_before_it_is_asked(sandbox: Sandbox) -> None:
    sandbox.files.make_dir("watched/deep")
    handle = sandbox.files.watch_dir("watched", recursive=True)
    try:
        sandbox.files.write("watched/a.txt", "one")
        sandbox.commands.run("echo two >> watched/deep/b.txt; rm watched/a.txt")
        got = [(e.type, e.name) for e in handle.get_new_events()]
        assert got[0] == (FilesystemEventType.CREATE, "a.txt")
        assert (FilesystemEventType.WRITE, "deep/b.txt") in got
        assert got[-1] == (FilesystemEventType.REMOVE, "a.txt")
        assert handle.get_new_events() == []
    finally:
        handle.stop()


def test_metrics_give_every_field_where_the_plugin_reads_the_page_cache_else_name_it(
        nomad_e2b: E2bServer, sandbox: Sandbox) -> None:
    """Memory held, totals, CPUs and disk are read (drivers/nomad/usage.py); the page cache
    where the client's plugin says it, else the refusal names it alone."""
    hutch_id = f"sbx_{sandbox.sandbox_id}"  # E2B's id: hutch's without sbx_
    state = json.loads((nomad_e2b.server.data_dir / "nomad" / f"{hutch_id}.json").read_text())
    if asyncio.run(plugin_reads_page_cache(state["alloc_id"])):
        (metric,) = sandbox.get_metrics()
        assert metric.mem_total == 512 * 2**20 and metric.cpu_count == 1  # the defaults: never unlimited
        assert 0 < metric.mem_used <= metric.mem_total and 0 <= metric.mem_cache <= metric.mem_used
        assert 0 < metric.disk_used < metric.disk_total
        return
    with pytest.raises(SandboxException) as caught:
        sandbox.get_metrics()
    message = str(caught.value)
    assert "driver nomad does not report memCache of sandbox" in message
    for field in ("cpuUsedPct", "cpuCount", "memUsed", "memTotal", "diskUsed", "diskTotal"):
        assert field not in message


# Whether each target's TCP port opens, from inside the sandbox (its own python3).
_CONNECTS = ("python3 -c \"import socket, sys\nfor t in sys.argv[1:]:\n    try:\n"
             "        socket.create_connection((t, 8080), 3).close(); print('open')\n"
             "    except OSError as err:\n        print(type(err).__name__)\" ")


def test_update_network_changes_what_the_sandbox_reaches(nomad_e2b: E2bServer) -> None:
    """E2B's update_network on the nomad driver, held by packets to tests/isolation's fake
    internet (one server under two addresses): a deny-list, an allow-list, off, open again;
    and a sandbox made without network gets none from it (501 saying so)."""
    from tests.isolation.test_local_network import INET_SERVER, INET_SERVER2, fake_internet_running

    with fake_internet_running(), Sandbox.create(timeout=120, allow_internet_access=True) as sbx:
        def reaches() -> list[str]:
            return sbx.commands.run(_CONNECTS + f"{INET_SERVER} {INET_SERVER2}").stdout.split()

        assert reaches() == ["open", "open"]
        for update, expected in (({"deny_out": [INET_SERVER]}, ["ConnectionRefusedError", "open"]),
                                 ({"allow_out": [INET_SERVER], "deny_out": ["0.0.0.0/0"]},
                                  ["open", "ConnectionRefusedError"]),
                                 ({"allow_internet_access": False}, ["ConnectionRefusedError"] * 2),
                                 ({}, ["open", "open"])):
            sbx.update_network(update)
            assert reaches() == expected, update
    with Sandbox.create(timeout=30) as plain:  # hutch's default: no network
        with pytest.raises(SandboxException, match=r"501: network: sandbox .* was made without outbound network"):
            plain.update_network({"deny_out": ["8.8.8.8"]})
        plain.update_network({"allow_internet_access": False})  # off: what it has


def test_any_port_a_process_opens_is_reached_at_its_host(nomad_e2b: E2bServer) -> None:
    """E2B's `{port}-{id}.{domain}` for a port no create declared, on the nomad driver (the
    plugin's connect verb): served with the sandbox's traffic token only, to a sandbox without
    network that keeps none; no credential of the client reaches it; a port where nothing
    listens says so."""
    from tests.e2b.test_hosts import _ECHO, _get, _wait_for

    with Sandbox.create(timeout=120) as sbx:
        sbx.files.write("echo.py", _ECHO)
        sbx.commands.run("python3 echo.py", background=True)
        url = f"https://8000-{sbx.sandbox_id}.{nomad_e2b.domain}/"
        status, answer = _get(nomad_e2b, url)
        assert status == 403 and "traffic access token" in answer["message"]
        status, raw = _wait_for(nomad_e2b, url, E2B_Traffic_Access_Token=sbx.traffic_access_token,
                                Authorization=f"Bearer {KEY}", X_API_Key=KEY)
        assert status == 200, raw
        seen = json.loads(raw)
        assert not {"cookie", "authorization", "x-api-key", "e2b-traffic-access-token"} & set(seen), seen
        status, answer = _get(nomad_e2b, f"https://8001-{sbx.sandbox_id}.{nomad_e2b.domain}/",
                              E2B_Traffic_Access_Token=sbx.traffic_access_token)
        assert status == 502 and "nothing answers on port 8001" in answer["message"]
        assert sbx.commands.run("tail -n +3 /proc/net/dev | cut -d: -f1").stdout.split() == ["lo"]
