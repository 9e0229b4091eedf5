"""A take-over whose driver cannot adopt the sandbox (the nomad driver: its state file not
written, a full disk; it ends the sandbox and says so with DriverFailure). The error went up to
the replication loop, which logged it: the sandbox stayed claimed by a replica that did not
drive it, recorded running, its commands running. Now it is recorded failed, its commands
too, and its claim goes; the reason names no host path or Nomad id (the log does)."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any, cast

import pytest

from hutch.core.errors import DriverFailure, EndedUnadopted
from hutch.core.lifecycle import Fail, FinishExecution
from hutch.core.models import ExecutionStatus, Mode, SandboxStatus
from hutch.service.takeover import Takeover

WORDS = ("sandbox sbx_1: taking it over, writing its state file /data/nomad/sbx_1.json failed (No space left "
         "on device); its Nomad job hutch-0123abcd-sbx_1 was stopped and purged")


class _Adoption:
    async def adopt(self, sandbox: Any, handle: dict[str, str]) -> bool:
        raise EndedUnadopted(WORDS, sandbox_id=sandbox.sandbox_id)


def _takeover(sb: Any, executions: list[Any], recorded: list[Any], destroyed: list[str]) -> Takeover:
    async def last_position() -> int:
        return 0

    async def wait_for(position: int) -> None:
        return None

    async def get_sandbox(sandbox_id: str) -> Any:
        return sb

    async def list_executions(sandbox_id: str) -> list[Any]:
        return executions

    async def command(sandbox_id: str, cmd: Any) -> None:
        recorded.append(cmd)

    async def destroy(sandbox_id: str) -> None:
        destroyed.append(sandbox_id)

    n = cast(Any, None)
    return Takeover(log=cast(Any, SimpleNamespace(last_position=last_position)),
                    store=cast(Any, SimpleNamespace(get_sandbox=get_sandbox, list_executions=list_executions)),
                    projector=cast(Any, SimpleNamespace(wait_for=wait_for)), reads=n,
                    recorder=cast(Any, SimpleNamespace(command=command)), control=n, reaper=n,
                    lifecycle=cast(Any, SimpleNamespace(destroy=destroy)), adoption=cast(Any, _Adoption()))


async def test_a_sandbox_the_driver_could_not_adopt_is_recorded_failed(caplog: pytest.LogCaptureFixture) -> None:
    sb = SimpleNamespace(sandbox_id="sbx_1", node=None, status=SandboxStatus.IDLE,
                         spec=SimpleNamespace(mode=Mode.INTERACTIVE))
    running = SimpleNamespace(execution_id="ex_1", status=ExecutionStatus.RUNNING)
    recorded: list[Any] = []
    destroyed: list[str] = []
    why = "the replica running it (r1) was lost"
    with caplog.at_level(logging.ERROR, logger="hutch.service.takeover"):
        kept = await _takeover(sb, [running], recorded, destroyed).adopt("sbx_1", {"job_id": "j", "alloc_id": "a"},
                                                                          why)
    assert kept is False  # its claim goes
    assert recorded[0] == FinishExecution("ex_1", ExecutionStatus.FAILED, error=why)
    assert isinstance(recorded[1], Fail) and recorded[1].reason.startswith(why), recorded
    assert "could not record it" in recorded[1].reason
    assert "/data" not in recorded[1].reason and "hutch-0123abcd" not in recorded[1].reason  # the tenant reads it
    assert WORDS in caplog.text  # the operator reads it


class _NomadAway:
    async def adopt(self, sandbox: Any, handle: dict[str, str]) -> bool:
        raise DriverFailure("nomad at http://10.0.0.5:4646 does not answer (GET /v1/allocation/a): timeout")


async def test_a_driver_that_could_not_ask_ends_nothing_and_says_nothing_false() -> None:
    """A DriverFailure of another kind (Nomad not answering as its allocation is read) says
    nothing of whether the sandbox runs: the driver ended nothing (it never knew the sandbox,
    so the take-over's destroy stops no job). Recorded failed "could not record it, and ended
    it", with its claim gone, its job ran on recorded nowhere. It goes up to the take-over's
    loop, which logs it, as before the state-file case was told apart."""
    sb = SimpleNamespace(sandbox_id="sbx_1", node=None, status=SandboxStatus.IDLE,
                         spec=SimpleNamespace(mode=Mode.INTERACTIVE))
    recorded: list[Any] = []
    takeover = _takeover(sb, [], recorded, [])
    takeover._adoption = cast(Any, _NomadAway())
    with pytest.raises(DriverFailure, match="does not answer"):
        await takeover.adopt("sbx_1", {"job_id": "j", "alloc_id": "a"}, "the replica running it (r1) was lost")
    assert not [c for c in recorded if isinstance(c, Fail)], recorded
