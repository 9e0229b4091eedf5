"""`hutch sandbox checkpoint|ckpt` and `hutch sandbox stats` against a served hutch (fake driver)."""

from __future__ import annotations

import json

import pytest

from tests.cli.test_cli_live_files_jobs import cli, url  # noqa: F401  (the served-hutch fixture)


def test_checkpoint_commands_and_stats(url: str, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    code, out, _ = cli(capsys, "sandbox", "create", "--json")
    sid = json.loads(out)["sandboxId"]
    code, out, err = cli(capsys, "sandbox", "fs", "cp", __file__, f"{sid}:/workspace/a.py")
    assert code == 0, err
    code, out, _ = cli(capsys, "sandbox", "ckpt", "create", sid, "base", "--json")
    cp = json.loads(out)
    assert code == 0 and cp["id"].startswith("ckpt_") and cp["name"] == "base" and cp["parent"] == ""
    assert cli(capsys, "sandbox", "fs", "rm", sid, "/workspace/a.py")[0] == 0
    code, out, _ = cli(capsys, "sandbox", "checkpoint", "restore", sid, cp["id"])
    assert code == 0 and "restored" in out
    code, out, _ = cli(capsys, "sandbox", "fs", "ls", sid, "/workspace")
    assert "a.py" in out  # the deleted file is back
    code, out, _ = cli(capsys, "sandbox", "checkpoint", "list", sid, "--json")
    assert [c["name"] for c in json.loads(out)] == ["base"]
    assert cli(capsys, "sandbox", "checkpoint", "delete", sid, cp["id"])[0] == 0
    code, _, err = cli(capsys, "sandbox", "checkpoint", "restore", sid, cp["id"])
    assert code == 1 and "not found" in err and "Traceback" not in err

    code, out, _ = cli(capsys, "sandbox", "stats", "--json")
    assert code == 0 and json.loads(out)["sandboxes"]["created"] == 1
    with pytest.raises(SystemExit) as bad:
        cli(capsys, "sandbox", "stats", "--start", "yesterday")
    assert bad.value.code == 2 and "--start" in capsys.readouterr().err
