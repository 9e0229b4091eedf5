"""`hutch sandbox fs|env|job|pause|resume` against a served hutch (fake driver)."""

from __future__ import annotations

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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def url(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[str]:
    for var in ("HUTCH_URL", "HUTCH_HOST", "HUTCH_PORT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HUTCH_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("HUTCH_DRIVER", "fake")
    monkeypatch.setenv("HUTCH_API_KEY", "k")
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "hutch.cli", "serve", "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "HUTCH_LOG_LEVEL": "WARNING"},
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline
                time.sleep(0.1)
        monkeypatch.setenv("HUTCH_URL", f"http://127.0.0.1:{port}")
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err


def test_fs_env_job_pause_end_to_end(
    url: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out, err = cli(capsys, "sb", "create")
    assert code == 0, err
    sid = out.strip()

    local = tmp_path / "server.js"
    local.write_text("console.log('hi')\n")
    code, out, err = cli(
        capsys, "sb", "fs", "cp", str(local), f"{sid}:/home/agentuity/app/server.js", "--json"
    )
    assert code == 0, err
    report = json.loads(out)
    assert report["bytesTransferred"] == 18 and report["filesTransferred"] == 1
    assert report["directoriesCreated"][-1] == "/home/agentuity/app"

    code, out, _ = cli(capsys, "sb", "files", "ls", sid, "/home/agentuity/app", "-l")
    assert code == 0 and "server.js" in out and "-rw-r--r--" in out

    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    (src / "a" / "x.txt").write_text("x")
    assert cli(capsys, "sb", "fs", "cp", "-r", str(src), f"{sid}:/workspace/src")[0] == 0
    code, _, err = cli(capsys, "sb", "fs", "cp", "--strict", str(local), f"{sid}:/nope/f.js")
    assert code == 1 and "strict" in err

    archive = tmp_path / "src.zip"
    code, _, err = cli(capsys, "sb", "fs", "download", sid, str(archive), "--path", "/workspace/src")
    assert code == 0, err
    code, out, err = cli(
        capsys, "sb", "fs", "upload", sid, str(archive), "--path", "/workspace/copy", "--json"
    )
    assert code == 0, err
    assert json.loads(out)["files"] == 1
    assert cli(capsys, "sb", "fs", "cp", f"{sid}:/workspace/copy/a/x.txt", str(tmp_path / "o/x.txt"))[0] == 0
    assert (tmp_path / "o" / "x.txt").read_text() == "x"
    assert cli(capsys, "sb", "fs", "mkdir", sid, "/workspace/m/n", "-p")[0] == 0
    assert cli(capsys, "sb", "fs", "rm", sid, "/workspace/copy/a/x.txt")[0] == 0
    assert cli(capsys, "sb", "fs", "rmdir", sid, "/workspace/copy", "-r")[0] == 0

    code, out, _ = cli(capsys, "sb", "env", sid, "MY_VAR=value", "--json")
    assert json.loads(out)["env"]["MY_VAR"] == "value"
    assert cli(capsys, "sb", "env", sid, "-d", "MY_VAR")[0] == 0

    code, out, err = cli(capsys, "sb", "job", "create", sid, "--", "sleep", "60")
    assert code == 0, err
    job_id = out.strip()
    code, out, _ = cli(capsys, "sb", "job", "list", sid, "--json")
    assert [j["jobId"] for j in json.loads(out)["jobs"]] == [job_id]
    code, out, _ = cli(capsys, "sb", "job", "destroy", sid, job_id, "--force", "--json")
    assert json.loads(out)["status"] == "cancelled"
    # job logs: the output so far of a running job (returns while it runs), and with -f of a
    # finished one, stdout and stderr apart.
    code, out, err = cli(capsys, "sb", "job", "create", sid, "--", "sh", "-c", "echo line-1; echo err-1 >&2; sleep 60")
    running = out.strip()
    code, out, err = cli(capsys, "sb", "job", "logs", sid, running)
    assert (code, out, err) == (0, "line-1\n", "err-1\n")
    assert cli(capsys, "sb", "job", "stop", sid, running, "--force")[0] == 0
    code, out, err = cli(capsys, "sb", "job", "logs", sid, running, "-f")
    assert (code, out, err) == (0, "line-1\n", "err-1\n")

    assert cli(capsys, "sb", "hibernate", sid)[0] == 0
    code, out, _ = cli(capsys, "sb", "exec", sid, "--json", "--", "echo", "hi")
    assert json.loads(out)["autoResumed"] is True
    assert cli(capsys, "sb", "pause", sid)[0] == 0
    assert cli(capsys, "sb", "wake", sid)[0] == 0
    code, out, err = cli(capsys, "sb", "pause", sid, "--filesystem")  # the fake driver cannot: it says so
    assert code != 0 and "the fake driver cannot pause a sandbox filesystem-only" in err, (code, out, err)
    assert cli(capsys, "sb", "delete", sid, "--confirm")[0] == 0
