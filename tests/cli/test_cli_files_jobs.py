"""`hutch sandbox fs|env|job|pause|resume` against the wire fake: flags, aliases, output, exit codes."""

from __future__ import annotations

import json
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from hutch.cli import _files_jobs as fj
from hutch.cli import main, parse_args
from tests.sdk.fakewire import KEY, Script, ThreadedServer


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


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err


def new_sandbox(capsys: pytest.CaptureFixture[str]) -> str:
    code, out, _ = cli(capsys, "sb", "create")
    assert code == 0
    return out.strip()


@pytest.mark.parametrize(
    ("argv", "handler"),
    [
        (["sb", "fs", "cp", "a", "sbx_1:/b"], fj.cmd_fs_cp),
        (["sb", "files", "ls", "sbx_1"], fj.cmd_fs_ls),
        (["sb", "file", "list", "sbx_1", "/x", "-l"], fj.cmd_fs_ls),
        (["sb", "fs", "mkdir", "sbx_1", "/x", "-p"], fj.cmd_fs_mkdir),
        (["sb", "fs", "rm", "sbx_1", "/x"], fj.cmd_fs_rm),
        (["sb", "fs", "rmdir", "sbx_1", "/x", "-r"], fj.cmd_fs_rmdir),
        (["sb", "fs", "download", "sbx_1", "o.tgz"], fj.cmd_fs_download),
        (["sb", "fs", "dl", "sbx_1", "o.tgz", "--path", "/w", "--format", "zip"], fj.cmd_fs_download),
        (["sb", "fs", "upload", "sbx_1", "a.zip"], fj.cmd_fs_upload),
        (["sb", "fs", "ul", "sbx_1", "a.zip", "--path", "/w", "--format", "tar"], fj.cmd_fs_upload),
        (["sb", "env", "sbx_1", "A=1", "-d", "B", "--delete", "C"], fj.cmd_env),
        (["sb", "job", "list", "sbx_1", "--limit", "10"], fj.cmd_job_list),
        (["sb", "job", "ls", "sbx_1"], fj.cmd_job_list),
        (["sb", "job", "get", "sbx_1", "job_1"], fj.cmd_job_get),
        (["sb", "job", "destroy", "sbx_1", "job_1", "--force"], fj.cmd_job_destroy),
        (["sb", "job", "stop", "sbx_1", "job_1"], fj.cmd_job_destroy),
    ],
)
def test_parsing_and_aliases(argv: list[str], handler: object) -> None:
    assert parse_args(argv).handler is handler


def test_job_create_takes_the_command_after_double_dash() -> None:
    args = parse_args(["sb", "job", "create", "sbx_1", "--json", "--", "bun", "run", "--watch"])
    assert (args.handler, args.command, args.json) == (fj.cmd_job_create, ["bun", "run", "--watch"], True)


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["sb", "fs", "cp", "a.txt", "b.txt"], "SANDBOX_ID:PATH"),
        (["sb", "fs", "cp", "sbx_1:/a", "sbx_2:/b"], "local path"),
        (["sb", "fs", "cp", "/does/not/exist", "sbx_1:/b"], "/does/not/exist"),
        (["sb", "fs", "cp", "--timeout", "soon", "a", "sbx_1:/b"], "--timeout"),
        (["sb", "fs", "download", "sbx_1", "o.rar", "--format", "rar"], "--format"),
        (["sb", "fs", "upload", "sbx_1", "/no/such.tgz"], "/no/such.tgz"),
        (["sb", "fs", "download", "sbx_1", "/no/such/dir/o.tgz"], "OUTPUT_FILE"),
        (["sb", "env", "sbx_1", "NOVALUE"], "KEY=VALUE"),
        (["sb", "env", "sbx_1", "A=1", "-d", "A"], "--delete"),
        (["sb", "job", "create", "sbx_1"], "missing the command"),
        (["sb", "job", "list", "sbx_1", "--limit", "0"], "--limit"),
    ],
)
def test_bad_flags_and_values_exit_2_naming_them(
    capsys: pytest.CaptureFixture[str], argv: list[str], needle: str
) -> None:
    try:
        code = main(argv)
    except SystemExit as exited:  # argparse's own errors
        code = exited.code  # type: ignore[assignment]
    assert code == 2
    err = capsys.readouterr().err
    assert needle in err
    assert "Traceback" not in err


def test_cp_upload_json_reports_created_directories(
    server: ThreadedServer, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    sid = new_sandbox(capsys)
    local = tmp_path / "file.txt"
    local.write_bytes(b"x" * 1024)
    dest = f"{sid}:/home/agentuity/new/path/file.txt"
    code, out, _ = cli(capsys, "sb", "fs", "cp", str(local), dest, "--json")
    assert code == 0
    assert json.loads(out) == {
        "source": str(local),
        "destination": dest,
        "bytesTransferred": 1024,
        "filesTransferred": 1,
        "directoriesCreated": [
            "/home",
            "/home/agentuity",
            "/home/agentuity/new",
            "/home/agentuity/new/path",
        ],
    }
    assert server.wire.files[sid]["/home/agentuity/new/path/file.txt"] == b"x" * 1024
    # --strict refuses a missing parent, naming the flag
    code, _, err = cli(capsys, "sb", "fs", "cp", "--strict", str(local), f"{sid}:/must-exist/f.txt")
    assert code == 1
    assert "strict" in err and "/must-exist" in err
    assert "/must-exist/f.txt" not in server.wire.files[sid]


def test_cp_directories_need_r_both_ways(
    server: ThreadedServer, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    sid = new_sandbox(capsys)
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "mod.py").write_text("m = 1\n")
    (src / "main.py").write_text("print()\n")
    code, _, err = cli(capsys, "sb", "fs", "cp", str(src), f"{sid}:/workspace/src")
    assert code == 1
    assert "-r" in err
    code, out, _ = cli(capsys, "sb", "fs", "cp", "-r", str(src), f"{sid}:/workspace/src")
    assert code == 0
    assert "copied 2 files" in out
    assert server.wire.files[sid]["/workspace/src/pkg/mod.py"] == b"m = 1\n"

    code, _, err = cli(capsys, "sb", "fs", "cp", f"{sid}:/workspace/src", str(tmp_path / "back"))
    assert code == 1
    assert "-r" in err
    code, out, _ = cli(
        capsys, "sb", "fs", "cp", "-r", f"{sid}:/workspace/src", str(tmp_path / "back"), "--json"
    )
    assert code == 0
    assert json.loads(out)["filesTransferred"] == 2
    assert (tmp_path / "back" / "pkg" / "mod.py").read_text() == "m = 1\n"


def test_cp_download_file_into_existing_dir(
    server: ThreadedServer, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    sid = new_sandbox(capsys)
    server.wire.files.setdefault(sid, {})["/workspace/output.json"] = b"{}"
    code, _, _ = cli(capsys, "sb", "fs", "cp", f"{sid}:/workspace/output.json", str(tmp_path))
    assert code == 0
    assert (tmp_path / "output.json").read_bytes() == b"{}"
    code, _, err = cli(capsys, "sb", "fs", "cp", f"{sid}:/workspace/nope.json", str(tmp_path))
    assert code == 1
    assert "nope.json" in err


def test_ls_mkdir_rm_rmdir(
    server: ThreadedServer, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    sid = new_sandbox(capsys)
    assert cli(capsys, "sb", "fs", "mkdir", sid, "/workspace/a/b")[0] == 1  # no -p
    assert cli(capsys, "sb", "fs", "mkdir", sid, "/workspace/a/b", "-p")[0] == 0
    server.wire.files[sid] = {"/workspace/a/f.txt": b"hello"}
    code, out, _ = cli(capsys, "sb", "fs", "ls", sid, "/workspace/a")
    assert (code, out) == (0, "b/\nf.txt\n")
    code, out, _ = cli(capsys, "sb", "fs", "ls", sid, "/workspace/a", "-l")
    assert "drwxr-xr-x" in out and "-rw-r--r--" in out and "5" in out
    code, out, _ = cli(capsys, "sb", "fs", "ls", sid, "/workspace/a", "--json")
    assert {f["path"] for f in json.loads(out)["files"]} == {"b", "f.txt"}
    code, out, _ = cli(capsys, "sb", "fs", "rm", sid, "/workspace/a/f.txt", "--json")
    assert (code, json.loads(out)["found"]) == (0, True)
    code, _, err = cli(capsys, "sb", "fs", "rm", sid, "/workspace/a/f.txt")
    assert code == 1 and "-f" in err
    assert cli(capsys, "sb", "fs", "rm", sid, "/workspace/a/f.txt", "-f")[0] == 0
    code, _, err = cli(capsys, "sb", "fs", "rmdir", sid, "/workspace/a")
    assert code == 1 and "not empty" in err
    assert cli(capsys, "sb", "fs", "rmdir", sid, "/workspace/a", "-r")[0] == 0
    assert "/workspace/a/b" not in server.wire.dirs[sid]


def test_download_and_upload_archives(
    server: ThreadedServer, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    sid = new_sandbox(capsys)
    server.wire.files[sid] = {"/workspace/src/x.py": b"x", "/workspace/src/y.py": b"yy"}
    server.wire.dirs[sid] = {"/", "/workspace", "/workspace/src"}
    out_file = tmp_path / "src.tar.gz"
    code, out, _ = cli(
        capsys, "sb", "fs", "download", sid, str(out_file), "--path", "/workspace/src", "--json"
    )
    assert code == 0
    report = json.loads(out)
    assert report["format"] == "tar.gz" and report["bytes"] == out_file.stat().st_size
    with tarfile.open(out_file) as tf:
        assert sorted(tf.getnames()) == ["x.py", "y.py"]
    zip_file = tmp_path / "backup.zip"
    assert cli(capsys, "sb", "fs", "dl", sid, str(zip_file))[0] == 0
    assert server.wire.calls("GET", "/fs/download/")[-1]["query"] == {"format": "zip"}
    code, out, _ = cli(
        capsys, "sb", "fs", "upload", sid, str(out_file), "--path", "/workspace/copy", "--json"
    )
    assert code == 0
    assert json.loads(out)["files"] == 2
    assert server.wire.files[sid]["/workspace/copy/y.py"] == b"yy"


def test_env_sets_deletes_and_prints(server: ThreadedServer, capsys: pytest.CaptureFixture[str]) -> None:
    sid = new_sandbox(capsys)
    code, out, _ = cli(capsys, "sb", "env", sid, "VAR1=value1", "VAR2=a=b")
    assert (code, out) == (0, "VAR1=value1\nVAR2=a=b\n")
    code, out, _ = cli(capsys, "sb", "env", sid, "-d", "VAR1", "--json")
    assert json.loads(out) == {"sandboxId": sid, "env": {"VAR2": "a=b"}}
    assert server.wire.calls("PATCH", "/sandbox/env/")[-1]["json"] == {"env": {"VAR1": None}}


def test_jobs_round_trip(server: ThreadedServer, capsys: pytest.CaptureFixture[str]) -> None:
    sid = new_sandbox(capsys)
    server.wire.script = lambda argv: Script([], delay=30)
    code, out, err = cli(capsys, "sb", "job", "create", sid, "--", "bun", "run", "build")
    assert code == 0
    job_id = out.strip()
    assert job_id.startswith("job_") and "started job" in err
    code, out, _ = cli(capsys, "sb", "job", "get", sid, job_id, "--json")
    assert json.loads(out)["command"] == ["bun", "run", "build"]
    code, out, _ = cli(capsys, "sb", "job", "get", sid, job_id)
    assert "status:" in out and "running" in out
    code, out, _ = cli(capsys, "sb", "job", "list", sid)
    assert job_id in out and "bun run build" in out
    code, out, _ = cli(capsys, "sb", "job", "destroy", sid, job_id, "--force", "--json")
    assert json.loads(out)["status"] == "cancelled"
    assert server.wire.calls("DELETE", "/sandbox/sandboxes/")[-1]["query"] == {"force": "true"}
    code, _, err = cli(capsys, "sb", "job", "get", sid, "job_nope")
    assert code == 1 and "not found" in err


def test_pause_resume_aliases(server: ThreadedServer, capsys: pytest.CaptureFixture[str]) -> None:
    sid = new_sandbox(capsys)
    code, out, _ = cli(capsys, "sb", "hibernate", sid, "--json")
    assert (code, json.loads(out)["sandboxId"]) == (0, sid)
    code, out, _ = cli(capsys, "sb", "wake", sid)
    assert (code, out) == (0, f"resumed {sid}\n")
    code, out, _ = cli(capsys, "sb", "pause", sid)
    assert code == 0 and "paused" in out
    code, out, _ = cli(capsys, "sb", "exec", sid, "--json", "--", "echo", "hi")
    assert json.loads(out)["autoResumed"] is True
