"""Can one tenant's installs stop another tenant's creates? Tenant A, with a member key and no
quota, asks for sandboxes with ``packages`` whose install does not end (here: an npm registry
that never answers; a slow mirror or a large install does the same for as long as it lasts);
tenant B then creates a sandbox with no install at all.

A real ``hutch serve`` (local driver, embedded profile): A and B are this test process.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.adversarial.test_held_requests import call, key_of
from tests.system.server import Server

ATTACKS = 20  # creates of A's under way at once: more than the server has worker threads


@contextlib.contextmanager
def silent_registry() -> Iterator[str]:
    """An npm registry that takes connections and never answers."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(512)
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/"


MARK = b"starve15-never-installed"  # in the package names: this test's installs only


def installs(package: bytes) -> list[int]:
    """The installs of ``package`` that run (npm, whose argv names the packages)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                with open(f"/proc/{entry}/cmdline", "rb") as fh:
                    cmdline = fh.read()
                if package in cmdline and b"install" in cmdline:
                    found.append(int(entry))
    return found


def end_installs() -> None:
    """This test's installs killed: their builds fail."""
    for pid in installs(MARK):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    with silent_registry() as registry:
        srv = Server(tmp_path / "data", driver="local", HUTCH_NPM_REGISTRY=registry,
                     npm_config_fetch_retries="0").start(timeout=120)
        try:
            yield srv
            end_installs()
            srv.destroy_every_sandbox()
        finally:
            end_installs()
            srv.stop()


def test_a_tenants_endless_installs_leave_another_tenants_creates_and_installs_served(server: Server) -> None:
    """B's create without an install is served while A's installs hang. And the server builds
    a few installs at once for everyone: A's twenty held all of them, and B's one install waited
    for A's to end (here: never). An organization builds at most two at once now
    (service/provisioning.py), so B's begins while A's still hang."""
    a, b = key_of(server, "attacker"), key_of(server, "victim")
    answers: list[int] = []
    victim = MARK + b"-victim"

    def create(n: int) -> None:  # a package list of its own each: no build serves two
        body = {"runtime": "base:latest", "packages": [f"{MARK.decode()}-{n}"]}
        answers.append(call(server, a, "POST", "/sandbox", body, timeout=300)[0])

    attack = [threading.Thread(target=create, args=(n,)) for n in range(ATTACKS)]
    attack.append(threading.Thread(target=call, args=(server, b, "POST", "/sandbox", {
        "runtime": "base:latest", "packages": [victim.decode()]}), kwargs={"timeout": 300}))
    for thread in attack[:-1]:
        thread.start()
    try:
        threading.Event().wait(3)  # A's creates are under way
        assert not answers, answers
        status, made = call(server, b, "POST", "/sandbox", {"network": {"enabled": True}}, timeout=60)
        assert status == 201, ("B's create while A's installs run", status, made)
        status, ran = call(server, b, "POST", f"/sandbox/{made['data']['sandboxId']}/execute",  # type: ignore[index]
                           {"command": ["echo", "hi"]})
        assert status == 200, ("B's execute while A's installs run", status, ran)
        attack[-1].start()  # B's install
        deadline = time.monotonic() + 30
        while not installs(victim) and time.monotonic() < deadline:
            threading.Event().wait(0.2)
        assert installs(victim), "B's install did not begin while A's hung"
    finally:
        for thread in attack:  # each install killed as it starts, until every create is answered
            while thread.is_alive():
                end_installs()
                thread.join(0.5)


