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


@pytest.mark.parametrize(("env", "most", "limit"), [
    ({}, 4000, None),
    ({"HUTCH_MAX_SANDBOXES": "50", "HUTCH_MEMORY_COMMIT_LIMIT": "64Gi"}, 50, 64 << 30),  # the server-wide names
    ({"HUTCH_NODE_MAX_SANDBOXES": "7", "HUTCH_MAX_SANDBOXES": "50"}, 7, None),  # the agent's own name wins
])
def test_the_hosts_capacity_settings(tmp_path: Path, env: dict[str, str], most: int, limit: int | None) -> None:
    got = config.settings("n1", "127.0.0.1:7700", str(tmp_path), {"HUTCH_NODE_SECRET": SECRET, **env})
    assert (got.max_sandboxes, got.memory_limit) == (most, limit)


@pytest.mark.parametrize(("env", "line"), [
    ({"HUTCH_MAX_SANDBOXES": "many"}, "HUTCH_MAX_SANDBOXES: expected a positive whole number, got 'many'"),
    ({"HUTCH_MEMORY_COMMIT_LIMIT": "lots"}, "HUTCH_MEMORY_COMMIT_LIMIT: invalid value 'lots'; expected a size"),
    ({"HUTCH_MEMORY_COMMIT_LIMIT": "8Mi"}, "HUTCH_MEMORY_COMMIT_LIMIT: expected at least 16Mi, got '8Mi'"),
])
def test_a_bad_capacity_setting_is_refused_by_name(tmp_path: Path, env: dict[str, str], line: str) -> None:
    with pytest.raises(config.SettingError) as caught:
        config.settings("n1", "127.0.0.1:7700", str(tmp_path), {"HUTCH_NODE_SECRET": SECRET, **env})
    assert str(caught.value).startswith(line), caught.value
