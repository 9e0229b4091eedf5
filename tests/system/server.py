"""Start, kill and restart a real server process (``python -m hutch.api``) for system tests."""

from __future__ import annotations

import json
import os
import resource
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from tests.leftovers import destroy_every_sandbox

KEY = "system-test-key"
ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    def __init__(self, data_dir: Path, driver: str = "fake", root: Path = ROOT, *,
                 nofile: tuple[int, int] | None = None, **env: str) -> None:
        """``root``: the source tree the server runs (bench/compare.py: another commit's checkout).
        ``nofile``: the process's RLIMIT_NOFILE (soft, hard), as a shell or a unit would set it."""
        self.data_dir = data_dir
        self.nofile = nofile
        self.root = root
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            "HUTCH_DATA_DIR": str(data_dir),
            "HUTCH_PORT": str(self.port),
            "HUTCH_DRIVER": driver,
            "HUTCH_API_KEY": KEY,
            "PYTHONPATH": str(root),
            "HUTCH_NOMAD_POOL": "off",  # as in the API tests (tests/api/conftest.py)
            **env,
        }
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = data_dir.parent / f"server-{self.port}.log"

    def start(self, timeout: float = 60) -> Server:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env["HUTCH_PORT"] = str(self.port)
        with open(self.log, "ab") as out:  # the child keeps its own copy of the fd
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "hutch.api"], cwd=self.root, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                preexec_fn=None if self.nofile is None else self._limit_files,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log.read_text()[-4000:]}")
            try:
                with urllib.request.urlopen(self.url + "/healthz", timeout=1):
                    return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"server did not answer within {timeout}s:\n{self.log.read_text()[-4000:]}")

    def _limit_files(self) -> None:
        assert self.nofile is not None
        resource.setrlimit(resource.RLIMIT_NOFILE, self.nofile)

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def destroy_every_sandbox(self) -> None:
        """Before a last ``stop``: what the test made does not outlive it (tests/leftovers.py)."""
        destroy_every_sandbox(self.url, KEY)

    def call(self, method: str, path: str, body: Any = None, timeout: float = 30) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read())

    def data(self, method: str, path: str, body: Any = None, timeout: float = 30) -> Any:
        status, payload = self.call(method, path, body, timeout)
        assert 200 <= status < 300, (status, payload)
        return payload["data"]
