"""The CLI against the in-test wire fake (on its own thread): flags, aliases, output, exit codes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from hutch.cli import cmd_delete, cmd_list, main, parse_args
from tests.sdk.fakewire import KEY, Script, Step, ThreadedServer


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for var in ("HUTCH_URL", "HUTCH_API_KEY", "HUTCH_DATA_DIR", "HUTCH_DRIVER"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[ThreadedServer]:
    with ThreadedServer() as s:
        monkeypatch.setenv("HUTCH_URL", s.url)
        monkeypatch.setenv("HUTCH_API_KEY", KEY)
        yield s


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# ------------------------------------------------------------------ parsing


@pytest.mark.parametrize(
    ("argv", "handler"),
    [
        (["sb", "ls"], cmd_list),
        (["sandbox", "list"], cmd_list),
        (["sb", "rm", "sbx_1"], cmd_delete),
        (["sb", "del", "sbx_1"], cmd_delete),
        (["sb", "remove", "sbx_1"], cmd_delete),
        (["sb", "destroy", "sbx_1"], cmd_delete),
        (["sb", "terminate", "sbx_1"], cmd_delete),
    ],
)
def test_aliases(argv: list[str], handler: object) -> None:
    assert parse_args(argv).handler is handler


def test_everything_after_double_dash_is_the_command_verbatim() -> None:
    args = parse_args(["run", "--json", "--", "sh", "-c", "echo --json", "--", "x"])
    assert args.json is True
    assert args.command == ["sh", "-c", "echo --json", "--", "x"]
    args = parse_args(["sb", "exec", "sbx_1", "--timeout", "5s", "--", "ls", "-la"])
    assert (args.sandbox_id, args.timeout, args.command) == ("sbx_1", "5s", ["ls", "-la"])


def test_connection_flags_work_before_or_after_the_subcommand() -> None:
    assert parse_args(["--url", "http://a", "sb", "ls"]).url == "http://a"
    assert parse_args(["sb", "ls", "--url", "http://b", "--api-key", "x"]).url == "http://b"
    assert parse_args(["--url", "http://a", "sb", "ls"]).api_key is None


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["run", "--memory", "lots", "--", "x"], "--memory"),
        (["run", "--cpu", "-1", "--", "x"], "--cpu"),
        (["run", "--timeout", "soon", "--", "x"], "--timeout"),
        (["run", "--env", "NOVALUE", "--", "x"], "--env"),
        (["run", "--file", "nocolon", "--", "x"], "--file"),
        (["run", "--file", "a.txt:/does/not/exist", "--", "x"], "--file"),
        (["sb", "create", "--port", "80"], "--port"),
        (["sb", "create", "--idle-timeout", "forever"], "--idle-timeout"),
        (["sb", "create", "--metadata", "[1]"], "--metadata"),
        (["sb", "ls", "--status", "happy"], "--status"),
        (["sb", "ls", "--limit", "0"], "--limit"),
        (["sb", "ls", "--limit", "many"], "--limit"),
        (["sb", "events", "sbx_1", "--limit", "101"], "--limit"),
        (["sb", "ls", "--frobnicate"], "--frobnicate"),
        (["serve", "--port", "70000"], "--port"),
    ],
)
def test_bad_flags_exit_2_naming_the_flag(
    capsys: pytest.CaptureFixture[str], argv: list[str], flag: str
) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert flag in err
    assert "Traceback" not in err


def test_missing_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["run", "--json"])
    assert info.value.code == 2
    assert "put it after --" in capsys.readouterr().err


def test_in_process_flags_are_refused_with_a_remote_server(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HUTCH_URL", "http://127.0.0.1:9")
    code, _, err = run_cli(capsys, "run", "--driver", "fake", "--", "x")
    assert code == 2
    assert "--driver" in err


# ------------------------------------------------------------------ against the fake


def test_run_streams_output_and_exits_with_the_command_code(
    server: ThreadedServer, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    server.wire.script = lambda argv: Script(
        [Step("stdout", b"hello\n"), Step("stderr", b"warn\n")], exit_code=3
    )
    local = tmp_path / "main.py"
    local.write_text("print(1)")
    code, out, err = run_cli(
        capsys,
        "run",
        "--runtime",
        "python:3.13",
        "--memory",
        "256Mi",
        "--cpu",
        "500m",
        "--timeout",
        "30s",
        "--env",
        "A=1=2",
        "--file",
        f"main.py:{local}",
        "--network",
        "--",
        "python3",
        "main.py",
    )
    assert (code, out, err) == (3, "hello\n", "warn\n")
    body = server.wire.calls("POST", "/sandbox")[0]["json"]
    assert body["command"]["exec"] == ["python3", "main.py"]
    assert body["command"]["mode"] == "oneshot"
    assert body["command"]["files"][0]["path"] == "main.py"
    assert body["env"] == {"A": "1=2"}
    assert body["resources"] == {"memory": "256Mi", "cpu": "500m"}
    assert body["timeout"] == {"execution": "30s"}
    assert body["network"] == {"enabled": True}


def test_allow_limits_the_network_of_run_and_create(server: ThreadedServer, capsys: pytest.CaptureFixture[str]) -> None:
    server.wire.script = lambda argv: Script([], exit_code=0)
    assert run_cli(capsys, "run", "--network", "--allow", "pypi.org", "--allow", "10.0.0.0/8", "--", "true")[0] == 0
    assert server.wire.calls("POST", "/sandbox")[-1]["json"]["network"] == {
        "enabled": True, "allow": ["pypi.org", "10.0.0.0/8"]}
    assert run_cli(capsys, "sb", "create", "--network", "--allow", "pypi.org")[0] == 0
    assert server.wire.calls("POST", "/sandbox")[-1]["json"]["network"] == {"enabled": True, "allow": ["pypi.org"]}


def test_run_json_prints_the_result(
    server: ThreadedServer, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(capsys, "run", "--json", "--", "fail", "5")
    assert code == 5
    result = json.loads(out)
    assert result["exitCode"] == 5
    assert result["stderr"] == "boom\n"
    assert result["stdout"] == ""
    assert result["sandboxId"].startswith("sbx_")
    assert result["executionId"].startswith("exe_")
    assert result["status"] == "completed"
    assert isinstance(result["durationMs"], int)
    assert err == ""


def test_run_quiet_prints_nothing(
    server: ThreadedServer, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_cli(capsys, "sb", "run", "--quiet", "--", "echo", "hi") == (0, "", "")


def test_sandbox_lifecycle_commands(
    server: ThreadedServer, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(
        capsys,
        "sb",
        "new",
        "--name",
        "dev",
        "--memory",
        "1Gi",
        "--idle-timeout",
        "10m",
        "--port",
        "3000",
    )
    assert code == 0
    sandbox_id = out.strip()
    assert sandbox_id.startswith("sbx_")
    assert f"created sandbox {sandbox_id}" in err
    body = server.wire.calls("POST", "/sandbox")[0]["json"]
    assert body["timeout"] == {"idle": "10m"}
    assert body["network"] == {"port": 3000}

    code, out, err = run_cli(capsys, "sb", "exec", sandbox_id, "--", "echo", "hi")
    assert (code, out) == (0, "hi\n")
    code, out, err = run_cli(capsys, "sb", "exec", sandbox_id, "--", "fail", "7")
    assert (code, err) == (7, "boom\n")
    code, out, _ = run_cli(capsys, "sb", "exec", sandbox_id, "--json", "--", "echo", "x")
    assert code == 0
    assert json.loads(out)["stdout"] == "x\n"

    code, out, _ = run_cli(capsys, "sb", "ls")
    assert code == 0
    header, row = out.splitlines()
    assert header.split() == ["ID", "NAME", "STATUS", "MODE", "RUNTIME", "EXECS", "CREATED"]
    assert row.split()[:3] == [sandbox_id, "dev", "idle"]

    code, out, _ = run_cli(
        capsys, "sb", "list", "--status", "idle", "--limit", "5", "--offset", "0", "--json"
    )
    page = json.loads(out)
    assert page["total"] == 1
    assert page["sandboxes"][0]["sandboxId"] == sandbox_id
    assert server.wire.calls("GET", "/sandbox")[-1]["query"] == {
        "status": "idle",
        "limit": "5",
        "offset": "0",
    }

    code, out, _ = run_cli(capsys, "sb", "info", sandbox_id)
    assert "status:" in out
    assert "executions: 3" in out
    code, out, _ = run_cli(capsys, "sb", "show", sandbox_id, "--json")
    assert json.loads(out)["sandboxId"] == sandbox_id

    code, out, _ = run_cli(capsys, "sb", "execution", "ls", sandbox_id, "--json")
    executions = json.loads(out)["executions"]
    assert [x["command"] for x in executions] == [["echo", "hi"], ["fail", "7"], ["echo", "x"]]
    code, out, _ = run_cli(capsys, "sb", "execution", "get", executions[1]["executionId"])
    assert "exit code: 7" in out

    code, out, _ = run_cli(capsys, "sb", "rm", sandbox_id, "--confirm")
    assert (code, out) == (0, f"deleted {sandbox_id}\n")

    code, out, _ = run_cli(capsys, "sb", "events", sandbox_id)
    lines = out.splitlines()
    assert lines[0].split() == ["TIME", "TYPE", "EVENT", "ID", "DETAILS"]
    assert [line.split()[1] for line in lines[1:]] == ["create", "destroy"]
    code, out, _ = run_cli(
        capsys, "sb", "events", sandbox_id, "--reverse", "--limit", "1", "--json"
    )
    assert [e["type"] for e in json.loads(out)["events"]] == ["destroy"]
    assert server.wire.calls("GET", f"/sandbox/sandboxes/{sandbox_id}/events")[-1]["query"] == {
        "limit": "1",
        "direction": "desc",
    }


def test_runtime_list(server: ThreadedServer, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "sb", "rt", "ls")
    assert code == 0
    assert out.splitlines()[1].split()[:2] == ["base:latest", "srt_base"]
    code, out, _ = run_cli(
        capsys, "sandbox", "runtime", "list", "--sort", "name", "--direction", "asc", "--json"
    )
    assert [r["name"] for r in json.loads(out)["runtimes"]] == ["base:latest", "python:3.13"]


def test_server_errors_print_the_message_without_traceback(
    server: ThreadedServer, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(capsys, "sb", "get", "sbx_nope")
    assert code == 1
    assert out == ""
    assert err == "hutch: error: sandbox not found [SANDBOX_NOT_FOUND]\n"

    code, out, err = run_cli(capsys, "sb", "delete", "sbx_nope", "--json")
    assert code == 1
    assert json.loads(out) == {
        "sandboxId": "sbx_nope",
        "success": False,
        "message": "sandbox not found",
        "code": "SANDBOX_NOT_FOUND",
    }

    code, _, err = run_cli(capsys, "sb", "ls", "--api-key", "wrong")
    assert code == 1
    assert "invalid API key" in err
    assert "HUTCH_API_KEY" in err


def test_unreachable_server_is_reported(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HUTCH_URL", "http://127.0.0.1:9")
    code, _, err = run_cli(capsys, "sb", "ls")
    assert code == 1
    assert err.startswith("hutch: error: cannot reach hutch server at http://127.0.0.1:9")
    assert "Traceback" not in err


@pytest.mark.parametrize(("flags", "module", "names"), [
    (["serve", "--ssh-port", "2298"], "asyncssh", "the SSH gateway"),
    (["serve", "--event-log", "kafka://127.0.0.1:1/t"], "aiokafka", "the Kafka event log"),
    (["serve", "--store", "postgresql://u@127.0.0.1:1/d"], "asyncpg", "the PostgreSQL store"),
    (["serve", "--driver", "nomad"], "nomad", "the nomad driver"),
    (["projector", "--event-log", "kafka://127.0.0.1:1/t", "--store", "postgresql://u@127.0.0.1:1/d"], "aiokafka",
     "the Kafka event log"),
])
def test_a_part_without_the_server_extra_says_so_before_starting(tmp_path: Path, flags: list[str], module: str,
                                                                  names: str) -> None:
    """`pip install hutch` lacks the server extra: asking for a part that needs it ends at once
    with what is missing and the command that installs it (it was an internal error after the
    server had announced itself)."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    code = f"import sys; sys.modules[{module!r}] = None; from hutch.cli import main; sys.exit(main(sys.argv[1:]))"
    done = subprocess.run([sys.executable, "-c", code, *flags, "--data-dir", str(tmp_path)], capture_output=True,
                          text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(root)}, stdin=subprocess.DEVNULL)
    assert done.returncode == 2, done.stderr
    assert f"{names}" in done.stderr and f"needs {module}" in done.stderr
    assert "pip install 'hutch[server]'" in done.stderr
    assert "internal error" not in done.stderr and "listening" not in (done.stdout + done.stderr).lower()
