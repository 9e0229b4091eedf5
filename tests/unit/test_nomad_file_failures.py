"""How a nomad file operation's failure is said at the sandbox's pids limit (drivers/nomad/
files.py ``_failure``; the agent's own helpers, helpers.py). The operation's shell could not fork
and said so ("Cannot fork"), or the agent reported its helper's fork refused: each was a 502,
and is now SandboxBusy naming the limit. Live, at a full limit, the
alloc exec may instead lose its stream to Nomad (1006, runc's own clones refused: docs/nomad.md),
so the mapping is tested here, on the shells' own words, not against a filled sandbox."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from hutch.core.errors import DriverFailure, SandboxBusy
from hutch.drivers.nomad.agent import NoPidLeft
from hutch.drivers.nomad.files import NomadFiles
from hutch.drivers.nomad.helpers import _Run
from hutch.drivers.nomad.state import NomadSandbox

SB = NomadSandbox("sb-1", "hutch-job", "alloc-1", "base:latest", {})


def files() -> NomadFiles:
    made = NomadFiles.__new__(NomadFiles)  # only its failure wording is used: no Nomad behind it
    made._access = SimpleNamespace(gone=lambda sandbox_id: False)  # type: ignore[assignment]
    return made


@pytest.mark.parametrize("said", [b"hutch-fs: 28: Cannot fork\n", b"sh: can't fork\n"])  # dash's, busybox's
def test_a_shell_that_cannot_fork_is_the_pids_limit(said: bytes) -> None:
    err = files()._failure(SB, "list", "/tmp", 2, said)
    assert isinstance(err, SandboxBusy) and err.status == 409
    assert err.message.startswith("sandbox sb-1 is at its pids limit: file operation list on /tmp")


def test_another_failure_is_still_the_drivers() -> None:
    err = files()._failure(SB, "list", "/tmp", 2, b"hutch-fs: something else broke\n")
    assert type(err) is DriverFailure and "something else broke" in err.message


async def test_an_agent_helper_refused_at_the_pids_limit_is_the_pids_limit() -> None:
    """The agent's own file helpers (metadata, watches, disk readings) at a full pids limit: the
    agent reports the refused fork (NoPidLeft), said as SandboxBusy naming the limit (it was a
    502, "the exec agent did not start its helper")."""
    run = _Run.__new__(_Run)  # its agent's answer only: no agent behind it
    run.sandbox_id = "sb-1"
    run.task = asyncio.get_running_loop().create_future()
    run.task.set_exception(NoPidLeft("the sandbox's pids limit refused the command's fork: EAGAIN"))
    with pytest.raises(SandboxBusy, match="sandbox sb-1 is at its pids limit: the helper of this file operation"):
        await run.code()
