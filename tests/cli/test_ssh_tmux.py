"""`hutch ssh` as a person uses it: in a real terminal (tmux), against `hutch serve` with the
local driver. tmux's send-keys types, capture-pane reads the screen."""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.leftovers import destroy_every_sandbox

KEY = "tmux-test-key"
ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    data = tmp_path_factory.mktemp("data")
    port, ssh_port = _free_port(), _free_port()
    env = {**os.environ, "HUTCH_DATA_DIR": str(data), "HUTCH_DRIVER": "local", "HUTCH_API_KEY": KEY,
           "HUTCH_LOG_LEVEL": "WARNING", "PYTHONPATH": str(ROOT)}
    for var in ("HUTCH_URL", "HUTCH_EVENT_LOG", "HUTCH_STORE"):
        env.pop(var, None)
    proc = subprocess.Popen([sys.executable, "-m", "hutch.cli", "serve", "--port", str(port), "--ssh-port", str(ssh_port)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                urllib.request.urlopen(url + "/healthz", timeout=1).close()
                break
            except OSError:
                assert proc.poll() is None, "hutch serve exited"
                time.sleep(0.1)
        yield url
    finally:
        try:
            destroy_every_sandbox(url, KEY)
        finally:
            proc.terminate()
            proc.wait(30)


def _api(url: str, method: str, path: str, body: dict | None = None) -> dict:
    req = urllib.request.Request(url + path, method=method, data=json.dumps(body).encode() if body else None,
                                 headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as resp:
        return json.loads(resp.read())["data"]


class Tmux:
    def __init__(self, command: str) -> None:
        self.socket = f"hutch-{uuid.uuid4().hex[:8]}"
        self.run("new-session", "-d", "-s", "t", "-x", "100", "-y", "30", command)

    def run(self, *args: str) -> str:
        return subprocess.run(["tmux", "-L", self.socket, *args], check=True, capture_output=True, text=True).stdout

    def keys(self, *keys: str) -> None:
        self.run("send-keys", "-t", "t", *keys)

    def line(self, text: str) -> None:
        self.run("send-keys", "-t", "t", "-l", text)
        self.keys("Enter")

    def screen(self) -> str:
        return self.run("capture-pane", "-p", "-t", "t")

    def wait(self, pattern: str, timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            screen = self.screen()
            if re.search(pattern, screen):
                return screen
            time.sleep(0.1)
        raise AssertionError(f"no {pattern!r} on the screen:\n{self.screen()}")

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True)


@pytest.mark.timeout(600)  # a fresh machine builds the vim-tiny install layer first
def test_hutch_ssh_in_a_real_terminal(server: str) -> None:
    # vim is not in base:latest: the sandbox installs Debian's vim-tiny (a cached install
    # layer), which is `vi` (vim.tiny; the `vim` name comes with the full package).
    sid = _api(server, "POST", "/sandbox", {"runtime": "base:latest", "dependencies": ["vim-tiny"]})["sandboxId"]
    env = f"env PYTHONPATH={ROOT} HUTCH_URL={server} HUTCH_API_KEY={KEY} TERM=xterm-256color"
    tmux = Tmux(f"{env} {sys.executable} -m hutch.cli ssh {sid}; echo EXIT=$?; sleep 600")
    try:
        tmux.wait(r"@sandbox:~\$", timeout=400)  # bash's prompt (after the install layer on a fresh machine)
        tmux.line("echo hi-$((40+2))")
        tmux.wait(r"\nhi-42")
        tmux.run("resize-window", "-t", "t", "-x", "120", "-y", "40")
        tmux.line("stty size")
        tmux.wait(r"\n40 120")
        # Ctrl-C stops the foreground program; the shell lives on.
        tmux.line("sleep 100")
        time.sleep(0.5)
        tmux.keys("C-c")
        tmux.line("echo alive-$((1+1))")
        tmux.wait(r"\nalive-2")
        # A full-screen program: vim opens (its empty-buffer tildes), takes text, and quits.
        tmux.line("vi /tmp/note.txt")
        tmux.wait(r"(?m)^~\s*$")
        tmux.keys("i")
        tmux.run("send-keys", "-t", "t", "-l", "written-in-vim")
        tmux.keys("Escape")
        tmux.line(":wq")
        tmux.line("cat /tmp/note.txt")
        tmux.wait(r"\nwritten-in-vim")
        tmux.line("exit 7")
        tmux.wait(r"EXIT=7")  # the remote exit code is hutch ssh's
    finally:
        tmux.close()
    shown = subprocess.run([sys.executable, "-m", "hutch.cli", "ssh", sid, "ls", "-la", "--show"],
                           env={**os.environ, "PYTHONPATH": str(ROOT), "HUTCH_URL": server, "HUTCH_API_KEY": KEY},
                           capture_output=True, text=True, check=True).stdout
    port = _api(server, "GET", "/healthz").get("ssh", {}).get("port")
    assert shown.strip() == f"ssh -p {port} {sid}@127.0.0.1 'ls -la'"


def test_hutch_ssh_from_scripts_without_a_terminal(server: str, tmp_path: Path) -> None:
    """Scripts, CI jobs and agents: stdin a file, /dev/null, a pipe or closed; no terminal is
    asked for (as OpenSSH), stdout and stderr stay apart, input is not echoed back, and the
    remote exit code is ours. Under `script` with no window size, a terminal of 24x80."""
    sid = _api(server, "POST", "/sandbox", {"runtime": "base:latest"})["sandboxId"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HUTCH_URL": server, "HUTCH_API_KEY": KEY}
    hutch = [sys.executable, "-m", "hutch.cli", "ssh", sid]
    script = "echo out; echo err >&2; cat; exit 7"
    given = tmp_path / "input.txt"
    given.write_text("from-a-file\n")

    def ssh(*argv: str, **kw: object) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*hutch, *argv], env=env, capture_output=True, text=True, timeout=120, **kw)  # type: ignore[call-overload]

    with given.open() as fh:
        done = ssh(script, stdin=fh)
    assert (done.returncode, done.stdout, done.stderr) == (7, "out\nfrom-a-file\n", "err\n")
    done = ssh(script, stdin=subprocess.DEVNULL)
    assert (done.returncode, done.stdout, done.stderr) == (7, "out\n", "err\n")
    done = ssh(script, input="piped-once\n")
    assert (done.returncode, done.stdout, done.stderr) == (7, "out\npiped-once\n", "err\n")
    done = subprocess.run(["sh", "-c", 'exec "$@" <&-', "sh", *hutch, "echo closed-ok"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout) == (0, "closed-ok\n"), done.stderr
    # No command, stdin a script: the shell reads it (ssh host < script.sh).
    done = ssh(input="echo from-stdin-shell\nexit 3\n")
    assert (done.returncode, done.stdout) == (3, "from-stdin-shell\n"), done.stderr
    # -t forces a terminal even from /dev/null (no internal error), as ssh -t.
    done = subprocess.run([*hutch[:-1], "-t", sid, "stty size; exit 4"], env=env, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 4 and "24 80" in done.stdout, done.stdout + done.stderr
    # `script` gives a terminal of no size (0x0): the remote one is 24x80.
    line = shlex.join([*hutch, "stty size; exit 5"])
    done = subprocess.run(["script", "-qec", line, "/dev/null"], env=env, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 5 and "24 80" in done.stdout, done.stdout + done.stderr
