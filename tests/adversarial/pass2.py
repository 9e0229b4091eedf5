"""The world the second adversarial pass attacks (tests/adversarial/test_pass2_local_*.py): one
real ``hutch serve`` (``python -m hutch.api``, local driver, SSH gateway, a sandbox domain) per
module, with two organizations and keys of every role, as an attacker meets it from outside.

``alpha`` is the victim: an admin, a member, a read-only key, projects ``web`` and ``ml`` and
keys limited to ``web``. ``beta`` is the attacker: an admin, a member and a read-only key.
Sandboxes are made by the tests that need them (``World.sandbox`` keeps one per purpose), so a
module pays for what it uses. Nothing here skips: a missing service fails the setup.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp

from tests.services import drop_database, drop_topics, fresh_database, kafka_url
from tests.system.server import KEY, Server, free_port

DOMAIN = "sbx.pass2.test"


class World:
    def __init__(self, server: Server, ssh_port: int, home: Path) -> None:
        self.server, self.ssh_port, self.home = server, ssh_port, home
        self.url = server.url
        self.keys: dict[str, str] = {"boot": KEY}
        self.key_ids: dict[str, str] = {}
        self.projects: dict[str, str] = {}
        self._sandboxes: dict[str, str] = {}

    # ------------------------------------------------------------ plain HTTP, as curl would

    def call(self, who: str | None, method: str, path: str, body: Any = None, *,
             headers: dict[str, str] | None = None, raw: bytes | None = None,
             timeout: float = 60) -> tuple[int, Any]:
        """(status, the JSON answer or the raw bytes). ``who``: a key's name here, a secret, or None."""
        hdrs = {"Content-Type": "application/json", **(headers or {})}
        if who is not None:
            hdrs["Authorization"] = f"Bearer {self.keys.get(who, who)}"
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=hdrs)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                payload, status = resp.read(), resp.status
        except urllib.error.HTTPError as err:
            payload, status = err.read(), err.code
        try:
            return status, json.loads(payload)
        except ValueError:
            return status, payload

    def data(self, who: str | None, method: str, path: str, body: Any = None, **kw: Any) -> Any:
        status, answer = self.call(who, method, path, body, **kw)
        assert 200 <= status < 300, (method, path, status, answer)
        return answer["data"]

    def session(self) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(self.url)

    # ------------------------------------------------------------ the organizations

    def populate(self) -> None:
        for org in ("alpha", "beta"):
            self.data("boot", "POST", "/orgs", {"name": org})
        for org in ("alpha", "beta"):
            for role in ("admin", "member", "read-only"):
                self._key(f"{org}_{role}", f"org_{org}", {"role": role})
        for name in ("web", "ml"):
            self.projects[name] = self.data("alpha_admin", "POST", "/projects", {"name": name})["id"]
        self._key("web_admin", "org_alpha", {"role": "admin", "projects": ["web"]})
        self._key("web_member", "org_alpha", {"role": "member", "projects": ["web"]})

    def _key(self, name: str, org: str, body: dict[str, Any]) -> None:
        made = self.data("boot", "POST", f"/keys?orgId={org}", body)
        self.keys[name], self.key_ids[name] = made["secret"], made["id"]

    def sandbox(self, purpose: str, who: str = "beta_member", **spec: Any) -> str:
        """One sandbox per purpose for the module (made at first use)."""
        if purpose not in self._sandboxes:
            spec.setdefault("runtime", "python:3.13")
            self._sandboxes[purpose] = self.data(who, "POST", "/sandbox", spec)["sandboxId"]
        return self._sandboxes[purpose]

    def run(self, who: str, sandbox_id: str, script: str, *, timeout: float = 120) -> tuple[int, str, str]:
        """``sh -c script`` in the sandbox: (exit code, stdout, stderr)."""
        ex = self.data(who, "POST", f"/sandbox/{sandbox_id}/execute",
                       {"command": ["sh", "-c", script], "timeout": f"{int(timeout)}s"})
        done = self.data(who, "GET", f"/sandbox/execution/{ex['executionId']}?wait={int(timeout) + 30}s",
                         timeout=timeout + 60)
        out = self.stream(ex["stdoutStreamUrl"])
        err = self.stream(ex["stderrStreamUrl"])
        return done.get("exitCode", -1), out.decode(errors="replace"), err.decode(errors="replace")

    def python(self, who: str, sandbox_id: str, code: str, *args: str, timeout: float = 120) -> Any:
        """A Python probe in the sandbox, its last stdout line read as JSON."""
        quoted = " ".join(json.dumps(a) for a in args)
        script = f"cat > /tmp/probe.py <<'PROBE_EOF'\n{code}\nPROBE_EOF\npython3 /tmp/probe.py {quoted}"
        code_, out, err = self.run(who, sandbox_id, script, timeout=timeout)
        assert code_ == 0 and out.strip(), (code_, out[-2000:], err[-2000:])
        return json.loads(out.strip().splitlines()[-1])

    def stream(self, url: str) -> bytes:
        with urllib.request.urlopen(self.url + "/" + url.split("://", 1)[1].split("/", 1)[1], timeout=60) as resp:
            return bytes(resp.read())

    # ------------------------------------------------------------ the server process

    @property
    def pid(self) -> int:
        assert self.server.proc is not None
        return self.server.proc.pid

    def memory(self, which: str = "VmRSS") -> int:
        """The server's resident memory (``VmHWM``: its peak since ``reset_peak``), bytes."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith(which + ":"):
                return int(line.split()[1]) * 1024
        raise AssertionError(f"no {which}")

    def reset_peak(self) -> int:
        """Start measuring the server's peak memory afresh (a transient allocation is what an
        OOM kill needs, and it is gone again by the time the resident size is read)."""
        Path(f"/proc/{self.pid}/clear_refs").write_text("5")
        return self.memory()

    def keygen(self, name: str) -> Path:
        path = self.home / name
        if not path.exists():
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"{name}@pass2", "-f", str(path)],
                           check=True)
        return path


def start_world(tmp: Path, profile: str) -> Iterator[World]:
    env: dict[str, str] = {}
    cleanup = []
    if profile == "production":
        url, name = asyncio.run(fresh_database("pass2"))
        log = kafka_url("pass2")
        env = {"HUTCH_EVENT_LOG": log, "HUTCH_STORE": url}
        cleanup = [lambda: asyncio.run(drop_database(name)), lambda: asyncio.run(drop_topics(log))]
    data = tmp / "data"
    data.mkdir()
    ssh_port = free_port()
    server = Server(data, driver="local", HUTCH_SSH_PORT=str(ssh_port), HUTCH_SANDBOX_DOMAIN=DOMAIN,
                    HUTCH_RATE_LIMIT="", HUTCH_HOST="127.0.0.1", **env).start()
    world = World(server, ssh_port, tmp)
    try:
        world.populate()
        yield world
    finally:
        try:
            server.destroy_every_sandbox()
        finally:
            server.stop()
            for step in cleanup:
                step()


def wait_for(check: Any, timeout: float = 30, every: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(every)


__all__ = ["DOMAIN", "World", "start_world", "wait_for"]
