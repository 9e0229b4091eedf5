"""``hutch node serve`` refuses to start, in one line naming why, without what it needs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hutch.node import config

SECRET = "k" * 40


@pytest.mark.parametrize(("args", "env", "line"), [
    ([], {}, "hutch node serve: no node secret: set HUTCH_NODE_SECRET_FILE (or HUTCH_NODE_SECRET)"),
    ([], {"HUTCH_NODE_SECRET": "short"}, "hutch node serve: HUTCH_NODE_SECRET: the node secret must be at least 32 bytes (got 5)"),
    ([], {"HUTCH_NODE_SECRET_FILE": "/nonexistent"}, "hutch node serve: HUTCH_NODE_SECRET_FILE: cannot read /nonexistent"),
    (["--listen", "7700"], {"HUTCH_NODE_SECRET": SECRET}, "hutch node serve: --listen: expected HOST:PORT, got '7700'"),
    (["--name", "a/b"], {"HUTCH_NODE_SECRET": SECRET}, "hutch node serve: --name: letters, digits"),
])
def test_a_bad_setting_stops_the_agent_in_one_line(tmp_path: Path, args: list[str], env: dict[str, str], line: str) -> None:
    argv = {"--name": "n1", "--listen": "127.0.0.1:1", "--data-dir": str(tmp_path)}
    argv.update(dict(zip(args[::2], args[1::2], strict=True)))
    clean = {k: v for k, v in os.environ.items() if not k.startswith("HUTCH_NODE_")}
    proc = subprocess.run([sys.executable, "-m", "hutch", "node", "serve", *(x for kv in argv.items() for x in kv)],
                          env={**clean, **env}, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2, proc
    assert proc.stderr.startswith(line) and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stdout == ""


def test_without_root_it_refuses(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(config.SettingError, match=r"^hutch node serve needs root"):
        config.settings("n1", "127.0.0.1:7700", str(tmp_path), {"HUTCH_NODE_SECRET": SECRET})


def test_the_secret_file_wins(tmp_path: Path) -> None:
    (tmp_path / "secret").write_text("f" * 32 + "\n")
    env = {"HUTCH_NODE_SECRET_FILE": str(tmp_path / "secret"), "HUTCH_NODE_SECRET": SECRET}
    assert config.read_secret(env) == b"f" * 32
