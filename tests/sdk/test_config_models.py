"""Where the client finds its server and key; the wire converter."""

from __future__ import annotations

from pathlib import Path

import pytest

from hutch import SandboxClient, _config
from hutch.client import local_client
from hutch.models import FileToWrite, SandboxInfo, Timeouts, coerce_files, from_wire, to_wire


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for var in ("HUTCH_URL", "HUTCH_API_KEY", "HUTCH_DATA_DIR"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))


def test_one_rule_for_the_server_argument_env_local_server_then_embedded(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The URL argument, then HUTCH_URL, then the `hutch serve` holding this machine's data dir
    (its address in server.url), else the engine in this process."""
    import fcntl
    import os

    data = tmp_path / "xdg" / "hutch"
    data.mkdir(parents=True)
    assert SandboxClient().embedded
    (data / "server.url").write_text("http://127.0.0.1:8711\n")
    assert SandboxClient().embedded  # a stale file: no server holds the data dir
    fd = os.open(data / "server.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as a running server holds it
        client = SandboxClient()
        assert (client.url, client.embedded) == ("http://127.0.0.1:8711", False)
        monkeypatch.setenv("HUTCH_URL", "http://h:1/")
        assert SandboxClient().url == "http://h:1"
        assert SandboxClient("http://other:2").url == "http://other:2"
    finally:
        os.close(fd)


async def test_a_client_without_a_server_runs_the_engine_itself(monkeypatch: pytest.MonkeyPatch,
                                                              tmp_path: Path) -> None:
    monkeypatch.setenv("HUTCH_DRIVER", "fake")
    async with SandboxClient() as client:
        assert client.embedded
        sandbox = await client.create()
        assert sandbox.id.startswith("sbx_") and (await client.get(sandbox.id)).id == sandbox.id
        assert (tmp_path / "xdg" / "hutch" / "events.db").exists() or any((tmp_path / "xdg" / "hutch").iterdir())
    assert client.connection.engine is None  # stopped with the client


async def test_local_client_runs_its_own_engine_whatever_the_url_settings_say(monkeypatch: pytest.MonkeyPatch,
                                                                             tmp_path: Path) -> None:
    monkeypatch.setenv("HUTCH_URL", "http://127.0.0.1:9")  # nothing answers there
    async with local_client(data_dir=tmp_path / "data", driver="fake") as client:
        assert client.embedded and client.connection.engine is not None  # started as the context opened
        sandbox = await client.create()
        assert (await client.get(sandbox.id)).id == sandbox.id  # with the engine's own key
        assert (tmp_path / "data" / "api-key").exists()
    assert client.connection.engine is None


def test_a_client_of_a_server_loads_no_server_code(tmp_path: Path) -> None:
    """The engine's code (hutch/_embedded.py and the server under it) is imported only by a
    client that runs one: the SDK's modules and a client of a server stay light."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    code = ("import sys, hutch, hutch.sync, hutch.history, hutch.tenancy, hutch.terminal, hutch.workspace, "
            "hutch.local_engine; hutch.SandboxClient('http://127.0.0.1:9'); "
            "print(sorted(m for m in sys.modules if m.split('.')[:2] in (['hutch', p] for p in "
            "('_embedded', 'api', 'service', 'projections', 'drivers', 'eventlog', 'blobs'))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(root)}, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_api_key_argument_then_env_then_local_key_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert SandboxClient().api_key is None
    default_file = tmp_path / "xdg" / "hutch" / "api-key"
    default_file.parent.mkdir(parents=True)
    default_file.write_text("from-default-dir\n")
    assert SandboxClient().api_key == "from-default-dir"

    data = tmp_path / "data"
    data.mkdir()
    (data / "api-key").write_text("from-data-dir\n")
    monkeypatch.setenv("HUTCH_DATA_DIR", str(data))
    assert SandboxClient().api_key == "from-data-dir"
    monkeypatch.setenv("HUTCH_API_KEY", "from-env")
    assert SandboxClient().api_key == "from-env"
    assert SandboxClient(api_key="from-arg").api_key == "from-arg"


def test_default_data_dir_follows_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert _config.default_data_dir() == tmp_path / "xdg" / "hutch"
    monkeypatch.delenv("XDG_DATA_HOME")
    assert _config.default_data_dir() == Path.home() / ".local" / "share" / "hutch"


def test_round_trip_keeps_camel_case_and_drops_absent_fields() -> None:
    wire = {
        "sandboxId": "sbx_1",
        "status": "idle",
        "createdAt": "t",
        "executions": 0,
        "networkEnabled": False,
        "timeout": {"idle": "5m"},
        "somethingNew": 1,
    }
    info = from_wire(SandboxInfo, wire)
    assert info.network_enabled is False
    assert info.timeout == Timeouts(idle="5m")
    assert to_wire(info) == {k: v for k, v in wire.items() if k != "somethingNew"}


def test_files_accept_mapping_or_file_objects() -> None:
    assert coerce_files({"a": "x"}) == [FileToWrite("a", b"x")]
    assert coerce_files([FileToWrite("b", b"y"), ("c", "z")]) == [
        FileToWrite("b", b"y"),
        FileToWrite("c", b"z"),
    ]
    assert FileToWrite("a", b"hi").to_wire() == {"path": "a", "content": "aGk="}
