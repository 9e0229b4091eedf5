"""`hutch sandbox snapshot|snap` against a served hutch (fake driver): create, list, get, tag,
lineage, delete, and build from a declarative file (unchanged content is not rebuilt)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli.test_cli_live_files_jobs import cli, url  # noqa: F401  (the served-hutch fixture)


def fetch(capsys: pytest.CaptureFixture[str], sid: str, path: str, tmp: Path) -> bytes:
    local = tmp / "fetched"
    code, _, err = cli(capsys, "sandbox", "fs", "cp", f"{sid}:{path}", str(local))
    assert code == 0, err
    return local.read_bytes()


def test_snapshot_commands(url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    sid = json.loads(cli(capsys, "sandbox", "create", "--json", "--env", "A=1")[1])["sandboxId"]
    assert cli(capsys, "sandbox", "fs", "cp", __file__, f"{sid}:app/t.py")[0] == 0
    code, out, err = cli(capsys, "sandbox", "snapshot", "create", sid, "--name", "cli", "--tag", "v1", "--json")
    assert code == 0, err
    snap = json.loads(out)
    assert snap["snapshotId"].startswith("snp_") and snap["fileCount"] == 1 and snap["env"] == {"A": "1"}
    code, out, _ = cli(capsys, "sandbox", "create", "--snapshot", "cli:v1", "--json")
    child = json.loads(out)["sandboxId"]
    assert fetch(capsys, child, "app/t.py", tmp_path) == Path(__file__).read_bytes()

    code, out, _ = cli(capsys, "sandbox", "snap", "ls")
    assert code == 0 and snap["snapshotId"] in out and "v1" in out
    code, out, _ = cli(capsys, "sandbox", "snapshot", "get", "cli:v1")
    assert code == 0 and "app/t.py" in out and child in out  # the sandboxes made from it
    code, out, _ = cli(capsys, "sandbox", "snapshot", "tag", snap["snapshotId"], "--clear", "--json")
    assert code == 0 and "tag" not in json.loads(out)
    code, out, _ = cli(capsys, "sandbox", "snapshot", "tag", snap["snapshotId"], "prod")
    assert code == 0 and "prod" in out
    code, out, _ = cli(capsys, "sandbox", "snapshot", "lineage", "--name", "cli", "--json")
    assert [e["snapshotId"] for e in json.loads(out)] == [snap["snapshotId"]]
    assert cli(capsys, "sandbox", "snapshot", "delete", snap["snapshotId"], "--confirm")[0] == 0
    code, _, err = cli(capsys, "sandbox", "snapshot", "get", snap["snapshotId"])
    assert code == 1 and "not found" in err and "Traceback" not in err


def test_snapshot_build_and_generate(url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    code, out, _ = cli(capsys, "sandbox", "snapshot", "generate")
    assert code == 0 and "version: 1" in out
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "main.py").write_text("print('built')\n")
    (tmp_path / "src" / "main.test.py").write_text("skip me\n")
    (tmp_path / "agentuity-snapshot.yaml").write_text(
        "version: 1\nruntime: base:latest\nname: built\nfiles: ['src/**', '!**/*.test.py']\n"
        "env: {TOKEN: '${TOKEN}'}\nmetadata: {v: '${V}'}\n")
    args = ("sandbox", "snapshot", "build", str(tmp_path), "--env", "TOKEN=t0k", "--metadata", "V=2", "--json")
    code, out, err = cli(capsys, *args)
    assert code == 0, err
    built = json.loads(out)
    assert "[1/4]" in err and "[2/4] archive" in err and "[4/4] finalizing" in err  # progress, on stderr
    assert built["unchanged"] is False and built["fileCount"] == 1 and built["files"][0]["path"] == "src/main.py"
    assert built["env"] == {"TOKEN": "t0k"} and built["userMetadata"] == {"v": "2"}
    code, out, _ = cli(capsys, *args)
    assert json.loads(out)["unchanged"] is True and json.loads(out)["snapshotId"] == built["snapshotId"]
    code, out, _ = cli(capsys, *args, "--force")
    assert json.loads(out)["snapshotId"] != built["snapshotId"]
    sid = json.loads(cli(capsys, "sandbox", "create", "--snapshot", "built", "--json")[1])["sandboxId"]
    assert fetch(capsys, sid, "src/main.py", tmp_path) == b"print('built')\n"

    # Bad build files fail before anything reaches the server, naming the problem.
    (tmp_path / "agentuity-snapshot.yaml").write_text("version: 2\nruntime: base:latest\nfiles: [a]\n")
    code, _, err = cli(capsys, *args)
    assert code == 2 and "version" in err
    (tmp_path / "agentuity-snapshot.yaml").write_text("version: 1\nruntime: base:latest\ndependencies: [curl]\n")
    code, _, err = cli(capsys, *args)
    assert code == 1 and "dependencies" in err and "fake" in err  # this server's driver cannot install
