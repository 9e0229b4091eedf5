"""What the nomad driver's second-pass attacker tests share (test_pass2_nomad.py and
test_pass2_nomad_network.py): a driver per module on the dev agent and ways to run code in
its sandboxes."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from hutch.drivers.base import ExecRequest, ProvisionRequest
from hutch.drivers.nomad.driver import NomadDriver
from tests.drivers_support import Recorder, new_id, start_nomad

PY = "python:3.13"
MiB = 2**20


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def driver(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[NomadDriver]:
    """One driver on the dev agent for the module; what its tests leave is destroyed."""
    d = await start_nomad(tmp_path_factory.mktemp("nomad-pass2") / "data")
    assert isinstance(d, NomadDriver)
    try:
        yield d
    finally:
        for sid in list(d._sandboxes):
            await d.destroy(sid)
        await d.close()


async def make(driver: NomadDriver, **kw: Any) -> str:
    sid = new_id()
    await driver.provision(ProvisionRequest(sandbox_id=sid, runtime=PY, **kw))
    return sid


async def run(driver: NomadDriver, sid: str, argv: list[str], *, timeout: float = 60,
              env: dict[str, str] | None = None) -> tuple[int, str, str]:
    sink = Recorder()
    result = await driver.exec(ExecRequest(new_id("ex"), sid, argv, env=env or {}, timeout=timeout), sink)
    return result.exit_code, sink.stdout, sink.stderr


async def python(driver: NomadDriver, sid: str, script: str, *args: str, timeout: float = 60) -> Any:
    """Run ``script`` in the sandbox; what it printed last, as JSON."""
    code, out, err = await run(driver, sid, ["python3", "-c", script, *args], timeout=timeout)
    assert code == 0, f"exit {code}: {err}\n{out}"
    return json.loads(out.strip().splitlines()[-1])


def rss_mib() -> float:
    """This process's resident memory: the driver (the hutch server's part that reads what a
    sandbox sends) runs in it."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


async def launch_daemon(driver: NomadDriver, sid: str, script: str, *args: str) -> None:
    """Start ``script`` as a daemon of the sandbox, out of its command's process group and tag."""
    code, out, err = await run(driver, sid, ["sh", "-c", 'cat >/tmp/daemon.py <<"EOF"\n' + script + "\nEOF\n"
                                             'setsid env -i PATH="$PATH" python3 /tmp/daemon.py "$@" '
                                             '>/dev/null 2>&1 </dev/null &', "sh", *args])
    assert code == 0, (out, err)
