"""A survivor that claims two lost replicas at once lists what each placed ahead (its warm
pool) right after the claim, before adopting any sandbox. A replica that comes back while the
survivor adopts the first one's sandboxes places new pool jobs under its old id; listed late,
those would be taken for leftovers and ended, a sandbox a create had just claimed among them."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

from hutch.api.replication import Replication
from hutch.core.replicas import Claimed, SoleReplica


class _Replicas(SoleReplica):
    def __init__(self, claims: list[Claimed]) -> None:
        super().__init__("survivor")
        self.claims = claims

    async def claim_dead(self) -> list[Claimed]:
        claims, self.claims = self.claims, []
        return claims


class _Takeover:
    """A cluster whose pool jobs are listed per replica id, as a Nomad job listing would."""

    def __init__(self) -> None:
        self.placed = {"lost-a": ["pool-a1"], "lost-b": ["pool-b1"]}
        self.ended: list[str] = []

    async def leftovers(self, dead_replica: str) -> list[str]:
        return list(self.placed[dead_replica])

    async def adopt(self, sandbox_id: str, handle: Any, why: str, tenant: Any = None) -> bool:
        # lost-b returns while lost-a's sandbox is adopted and refills its pool anew
        self.placed["lost-b"].append("pool-b2-placed-after-return")
        return True

    async def discard_leftovers(self, leftovers: list[str], handles: list[Any]) -> None:
        self.ended.extend(leftovers)


async def test_leftovers_of_every_claimed_replica_are_listed_before_any_adoption() -> None:
    takeover = _Takeover()
    claims = [Claimed("lost-a", (("sb-a", None),)), Claimed("lost-b", (("sb-b", None),))]
    replication = Replication(_Replicas(claims), cast(Any, SimpleNamespace(takeover=takeover)))

    await replication.take_over()

    assert sorted(takeover.ended) == ["pool-a1", "pool-b1"]  # what each had placed before the claim


async def test_a_failed_listing_spares_that_replica_and_the_others_are_still_ended() -> None:
    takeover = _Takeover()

    async def leftovers(dead_replica: str) -> list[str]:
        if dead_replica == "lost-a":
            raise OSError("nomad: connection refused")
        return list(takeover.placed[dead_replica])

    takeover.leftovers = leftovers  # type: ignore[method-assign]
    claims = [Claimed("lost-a", (("sb-a", None),)), Claimed("lost-b", (("sb-b", None),))]
    replication = Replication(_Replicas(claims), cast(Any, SimpleNamespace(takeover=takeover)))

    await replication.take_over()

    assert takeover.ended == ["pool-b1"]
