"""The CLI with the real engine (fake driver): in-process `hutch run`, and `hutch serve`."""

from __future__ import annotations

import fcntl
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hutch.cli import main


@pytest.fixture(autouse=True)
def engine_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    for var in ("HUTCH_URL", "HUTCH_API_KEY", "HUTCH_HOST", "HUTCH_PORT"):
        monkeypatch.delenv(var, raising=False)
    data = tmp_path / "data"
    monkeypatch.setenv("HUTCH_DATA_DIR", str(data))
    monkeypatch.setenv("HUTCH_DRIVER", "fake")
    return data


def test_in_process_run_streams_and_exits_with_the_code(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", "--", "sh", "-c", "echo out; echo err >&2; exit 3"])
    out, err = capsys.readouterr()
    assert (code, out, err) == (3, "out\n", "err\n")


def test_in_process_run_json(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code = main(["run", "--json", "--env", "GREETING=hi", "--", "env"])
    result = json.loads(capsys.readouterr().out)
    assert code == 0
    assert result["exitCode"] == 0
    assert "GREETING=hi" in result["stdout"]
    assert result["sandboxId"].startswith("sbx_")


def test_in_process_run_leaves_no_socket_dir_behind(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    import tempfile

    before = {p.name for p in Path(tempfile.gettempdir()).glob("hutch-*")}
    assert main(["run", "--quiet", "--", "echo", "x"]) == 0
    after = {p.name for p in Path(tempfile.gettempdir()).glob("hutch-*")}
    assert after <= before


def test_in_process_run_explains_a_busy_data_dir(
    capsys: pytest.CaptureFixture[str], engine_env: Path
) -> None:
    engine_env.mkdir(parents=True)
    fd = os.open(engine_env / "server.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        code = main(["run", "--", "echo", "x"])
    finally:
        os.close(fd)
    err = capsys.readouterr().err
    assert code == 1
    assert "in use by another hutch server" in err
    assert "HUTCH_URL" in err
    assert "Traceback" not in err


def test_in_process_run_with_unknown_driver_is_a_clear_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["run", "--driver", "warp", "--", "echo", "x"])
    err = capsys.readouterr().err
    assert exited.value.code == 2  # a usage error, refused before anything starts
    assert "--driver" in err and "'warp'" in err and "local" in err
    assert "Traceback" not in err


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def served(engine_env: Path) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "hutch.cli", "serve", "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "HUTCH_LOG_LEVEL": "WARNING"},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
                time.sleep(0.1)
        yield url, proc
    finally:
        if proc.poll() is None:
            proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()  # a server that does not stop on SIGTERM is a bug, but not this test's
            proc.wait(5)
        if proc.stdout is not None and not proc.stdout.closed:
            proc.stdout.close()


def test_serve_prints_address_and_key_then_answers_the_cli(
    served: tuple[str, subprocess.Popen[str]], capsys: pytest.CaptureFixture[str], engine_env: Path
) -> None:
    url, _ = served
    # The key is read from the data dir by the client, as a local user would.
    code = main(["--url", url, "sb", "create", "--name", "served"])
    out, err = capsys.readouterr()
    assert code == 0, err
    sandbox_id = out.strip()
    assert main(["--url", url, "sb", "exec", sandbox_id, "--", "echo", "hi"]) == 0
    assert capsys.readouterr().out == "hi\n"
    assert main(["--url", url, "sb", "ls", "--json"]) == 0
    assert [s["sandboxId"] for s in json.loads(capsys.readouterr().out)["sandboxes"]] == [
        sandbox_id
    ]
    # Without --url or HUTCH_URL the CLI finds the server on its data dir (server.url); `hutch
    # run` goes there too instead of failing on a busy data dir.
    assert (engine_env / "server.url").read_text().strip() == url
    assert main(["sb", "ls", "--json"]) == 0
    assert [s["sandboxId"] for s in json.loads(capsys.readouterr().out)["sandboxes"]] == [sandbox_id]
    assert main(["run", "--", "echo", "via-the-server"]) == 0
    assert capsys.readouterr().out == "via-the-server\n"
    assert main(["--url", url, "sb", "delete", sandbox_id]) == 0
    capsys.readouterr()


def test_without_a_server_every_command_runs_the_engine_in_process(capsys: pytest.CaptureFixture[str],
                                                                   engine_env: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """No URL, no HUTCH_URL, no server: `hutch sb create` and the next command (a new process's
    engine adopts the data dir's sandboxes) work as `hutch run` does. The local driver: its
    sandboxes outlive the engine (the fake driver's live in its memory)."""
    monkeypatch.setenv("HUTCH_DRIVER", "local")
    assert main(["sb", "create", "--name", "embedded"]) == 0
    sandbox_id = capsys.readouterr().out.strip()
    assert main(["sb", "exec", sandbox_id, "--", "echo", "hi"]) == 0
    assert capsys.readouterr().out == "hi\n"
    assert main(["sb", "get", sandbox_id, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["name"] == "embedded"
    assert main(["sb", "delete", sandbox_id]) == 0
    assert not (engine_env / "server.url").exists()


def test_sandbox_history_and_time_travel(
    served: tuple[str, subprocess.Popen[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    url, _ = served
    assert main(["--url", url, "sb", "create", "--env", "STAGE=one"]) == 0
    sandbox_id = capsys.readouterr().out.strip()
    assert main(["--url", url, "sb", "env", sandbox_id, "STAGE=two"]) == 0
    capsys.readouterr()
    assert main(["--url", url, "sb", "history", sandbox_id, "--json"]) == 0
    steps = json.loads(capsys.readouterr().out)["history"]
    assert [s["type"] for s in steps] == ["create", "lifecycle:started", "env"]
    assert main(["--url", url, "sb", "history", sandbox_id]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["POSITION", "TIME", "EVENT", "ID", "TYPE", "STATUS", "AFTER"]  # as `events` has
    assert lines[1].endswith("creating") and lines[-1].endswith("idle") and " env " in lines[-1]
    assert main(["--url", url, "sb", "history", sandbox_id, "--at", steps[1]["eventId"]]) == 0
    shown = capsys.readouterr().out
    assert "lifecycle:started" in shown and "STAGE=one" in shown and "STAGE=two" not in shown
    assert main(["--url", url, "sb", "history", sandbox_id, "--at", "soon"]) == 1
    assert "asOf" in capsys.readouterr().err


def test_sandbox_fork(served: tuple[str, subprocess.Popen[str]], capsys: pytest.CaptureFixture[str]) -> None:
    url, _ = served
    assert main(["--url", url, "sb", "create", "--env", "K=v"]) == 0
    parent = capsys.readouterr().out.strip()
    assert main(["--url", url, "sb", "fork", parent, "-n", "2"]) == 0
    copies = capsys.readouterr().out.split()
    assert len(copies) == 2 and all(c.startswith("sbx_") and c != parent for c in copies)
    assert main(["--url", url, "sb", "fork", parent, "-n", "0"]) == 1
    assert "count" in capsys.readouterr().err
    # An id is one path segment: `../snapshots/S` is not read as another route (a 404 naming it).
    assert main(["--url", url, "sb", "fork", f"../sandbox/{parent}", "-n", "1"]) == 1
    assert "not found" in capsys.readouterr().err.lower()
    # The fork's record of its instant stays out of `snapshot list` unless asked for.
    assert main(["--url", url, "sb", "snapshot", "list", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["snapshots"] == []
    assert main(["--url", url, "sb", "snapshot", "list", "--forks", "--json"]) == 0
    assert [s["name"][:5] for s in json.loads(capsys.readouterr().out)["snapshots"]] == ["fork-"]


def test_ssh_keys(served: tuple[str, subprocess.Popen[str]], capsys: pytest.CaptureFixture[str],
                  tmp_path: Path) -> None:
    url, _ = served
    key = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "me@laptop", "-f", str(key)], check=True)
    assert main(["--url", url, "ssh-key", "add", f"{key}.pub", "--json"]) == 0
    added = json.loads(capsys.readouterr().out)
    assert added["name"] == "me@laptop" and added["fingerprint"].startswith("SHA256:")
    assert main(["--url", url, "ssh-key", "list"]) == 0
    assert added["id"] in capsys.readouterr().out
    assert main(["--url", url, "ssh-key", "add", str(key)]) == 1  # the private key: refused by name
    assert "private key" in capsys.readouterr().err
    assert main(["--url", url, "ssh-key", "remove", added["id"]]) == 0
    assert capsys.readouterr().out.strip() == f"removed {added['id']}"


def test_serve_output(served: tuple[str, subprocess.Popen[str]], engine_env: Path) -> None:
    url, proc = served
    proc.terminate()
    output, _ = proc.communicate(timeout=10)
    key = (engine_env / "api-key").read_text().strip()
    assert url in output
    assert key in output  # printed once, because it was generated now


def test_in_process_run_shows_a_first_use_build(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A runtime the server has not built yet: the CLI says so and shows the build's steps
    (the sandbox's runtime:build events) on stderr, then the command's output as usual."""
    monkeypatch.setenv("HUTCH_FAKE_UNBUILT", "node:lts")
    code = main(["run", "--runtime", "node:lts", "--", "echo", "after the build"])
    out, err = capsys.readouterr()
    assert (code, out) == (0, "after the build\n"), err
    assert "building it first (first use)" in err
    assert "building runtime: node:lts: [1/2] fake step" in err and "[2/2]" in err


def test_execution_cancel_ends_a_running_command(
    served: tuple[str, subprocess.Popen[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    """`hutch sandbox execution cancel` and the SDK's ExecutionHandle.cancel (which it uses)."""
    import asyncio

    from hutch import SandboxClient

    url, _ = served
    assert main(["--url", url, "sb", "create"]) == 0
    sandbox_id = capsys.readouterr().out.strip()

    async def start() -> str:
        async with SandboxClient(url=url) as client:
            sandbox = await client.connect(sandbox_id)
            handle = await sandbox.start(["sleep", "60"])
            other = await sandbox.start(["sleep", "61"])
            assert (await other.cancel()).status == "cancelled"  # the SDK's own call
            return handle.execution_id

    execution_id = asyncio.run(start())
    assert main(["--url", url, "sb", "execution", "cancel", execution_id, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert (info["status"], info["error"]) == ("cancelled", "cancelled on request")


def test_piped_stdin_reaches_the_command(engine_env: Path, tmp_path: Path) -> None:
    """`echo hi | hutch run -- cat` prints hi; `< file` too; --no-stdin sends nothing."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    run = [sys.executable, "-m", "hutch", "run", "--", "cat"]
    piped = subprocess.run(run, input=b"hi\n", capture_output=True, env=env, timeout=60, check=False)
    assert (piped.returncode, piped.stdout) == (0, b"hi\n"), piped.stderr
    source = tmp_path / "in.txt"
    source.write_bytes(b"from a file\n" * 1000)
    with source.open("rb") as fh:
        redirected = subprocess.run(run, stdin=fh, capture_output=True, env=env, timeout=60, check=False)
    assert redirected.stdout == source.read_bytes(), redirected.stderr
    ignored = subprocess.run([*run[:4], "--no-stdin", "--", "cat"], input=b"nope\n", capture_output=True, env=env,
                             timeout=60, check=False)
    assert (ignored.returncode, ignored.stdout) == (0, b""), ignored.stderr


def test_a_command_killed_for_memory_says_so(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """It ran and was killed at its limit: the note says so and how to raise it (it said "could
    not be run"), and --json carries the error. The local driver's real memory cgroup."""
    monkeypatch.setenv("HUTCH_DRIVER", "local")
    hog = ["--memory", "64Mi", "--", "sh", "-c", "head -c 400m /dev/zero | tail > /dev/null"]
    code = main(["run", *hog])
    err = capsys.readouterr().err
    assert code != 0
    assert "killed: out of memory (limit 64Mi)" in err and "--memory" in err, err
    assert "could not be run" not in err
    code = main(["run", "--json", *hog])
    result = json.loads(capsys.readouterr().out)
    assert result["status"] == "failed" and result["error"] == "killed: out of memory (limit 64Mi)"


def test_sandbox_network_rules_from_the_command_line(capsys: pytest.CaptureFixture[str],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """`sb create --network --deny`, then `sb network` replaces the rules (the local driver, in
    process: each command's engine adopts the sandbox the last one left)."""
    monkeypatch.setenv("HUTCH_DRIVER", "local")
    assert main(["sb", "create", "--network", "--deny", "192.0.2.9"]) == 0
    sandbox_id = capsys.readouterr().out.strip()
    try:
        assert main(["sb", "get", sandbox_id, "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["networkDeny"] == ["192.0.2.9/32"]
        assert main(["sb", "network", sandbox_id, "--allow", "192.0.2.7"]) == 0
        assert capsys.readouterr().out == f"{sandbox_id}: network limited to 192.0.2.7/32\n"
        assert main(["sb", "network", sandbox_id, "--off", "--deny", "192.0.2.9"]) == 2  # a usage error
        assert "--off takes no --allow or --deny" in capsys.readouterr().err
        assert main(["sb", "network", sandbox_id, "--deny", "example.com"]) == 1
        assert "network.deny" in capsys.readouterr().err
        assert main(["sb", "network", sandbox_id, "--off"]) == 0
        assert capsys.readouterr().out == f"{sandbox_id}: network off\n"
        assert main(["sb", "network", sandbox_id]) == 0
        assert capsys.readouterr().out == f"{sandbox_id}: network unrestricted\n"
    finally:
        assert main(["sb", "delete", sandbox_id]) == 0
