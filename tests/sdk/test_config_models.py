"""Where the client finds its server and key; the wire converter."""

from __future__ import annotations

from pathlib import Path

import pytest

from hutch import SandboxClient, _config
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
