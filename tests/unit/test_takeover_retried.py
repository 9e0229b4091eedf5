"""A sandbox whose take-over failed for a passing reason (Nomad or the log not answering) is
tried again on the survivor's next round, not left claimed and driven by nobody: its claim
moved it to the survivor, so no other replica will ever take it over, and until it is
adopted its reaper, its timeouts and its commands' ends belong to no one."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

from hutch.api.replication import Replication
from hutch.core.replicas import Claimed, SoleReplica


class _Replicas(SoleReplica):
    def __init__(self, claims: list[Claimed]) -> None:
        super().__init__("survivor")
        self.claims = claims
        self.disowned: list[str] = []

    async def claim_dead(self) -> list[Claimed]:
        claims, self.claims = self.claims, []
        return claims

    async def disown(self, sandbox_id: str, *, lazily: bool = False) -> None:
        self.disowned.append(sandbox_id)


class _Takeover:
    def __init__(self, failures: int, keeps: bool = True) -> None:
        self.failures, self.keeps = failures, keeps
        self.tried: list[tuple[str, Any, str, Any]] = []

    async def leftovers(self, dead_replica: str) -> list[str]:
        return []

    async def adopt(self, sandbox_id: str, handle: Any, why: str, tenant: Any = None) -> bool:
        self.tried.append((sandbox_id, handle, why, tenant))
        if len(self.tried) <= self.failures:
            raise OSError("nomad: connection refused")
        return self.keeps


def _replication(takeover: _Takeover) -> tuple[Replication, _Replicas]:
    replicas = _Replicas([Claimed("lost-a", (("sb-a", {"job": "j"}),), (("sb-a", "tenant-a"),))])
    return Replication(replicas, cast(Any, SimpleNamespace(takeover=takeover))), replicas


async def test_a_failed_take_over_is_tried_again_on_the_next_round_as_it_was() -> None:
    takeover = _Takeover(failures=2)
    replication, replicas = _replication(takeover)
    for _ in range(3):  # the first round claims; the claim is not made again
        await replication.take_over()
    assert len(takeover.tried) == 3, "tried until it was adopted"
    assert all(t == takeover.tried[0] for t in takeover.tried), "the same handle, reason and tenant each time"
    await replication.take_over()
    assert len(takeover.tried) == 3, "once adopted, not tried again"
    assert replicas.disowned == []


async def test_one_that_ended_meanwhile_is_let_go_once_tried_again() -> None:
    takeover = _Takeover(failures=1, keeps=False)
    replication, replicas = _replication(takeover)
    await replication.take_over()
    await replication.take_over()
    assert replicas.disowned == ["sb-a"]
    await replication.take_over()
    assert len(takeover.tried) == 2
