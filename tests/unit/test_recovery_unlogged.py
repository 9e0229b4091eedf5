"""A replica that starts while another makes a sandbox: since a create is recorded in one
append after the driver made it (service/provisioning.py), a running sandbox the log does not
know yet may be another live replica's create under way. Its owner row was committed before
the driver was asked, so recovery leaves it to that replica; one owned by this replica (its
own restart) or by a dead one is destroyed as before."""

from __future__ import annotations

from typing import Any, cast

from hutch.core.replicas import Owner
from hutch.service.recovery import Recovery


class _Store:
    async def get_sandbox(self, sandbox_id: str) -> None:
        return None  # the log has no record of any of them


class _Replicas:
    me = "r1"

    def __init__(self, owners: dict[str, Owner]) -> None:
        self.owners = owners

    async def owner(self, sandbox_id: str) -> Owner | None:
        return self.owners.get(sandbox_id)


class _Control:
    def __init__(self, replicas: _Replicas) -> None:
        self.replicas = replicas


class _Lifecycle:
    def __init__(self) -> None:
        self.destroyed: list[str] = []

    async def destroy(self, sandbox_id: str) -> None:
        self.destroyed.append(sandbox_id)


async def test_an_unlogged_sandbox_another_live_replica_owns_is_left_to_it() -> None:
    owners = {"sbx_other_live": Owner("r2", "http://r2", True), "sbx_other_dead": Owner("r3", "http://r3", False),
              "sbx_mine": Owner("r1", "http://r1", True)}
    lifecycle = _Lifecycle()
    recovery = Recovery(cast(Any, _Store()), cast(Any, None), cast(Any, _Control(_Replicas(owners))),
                        cast(Any, lifecycle), cast(Any, None))
    await recovery._destroy_unowned({"sbx_other_live", "sbx_other_dead", "sbx_mine", "sbx_nobody"})
    assert sorted(lifecycle.destroyed) == ["sbx_mine", "sbx_nobody", "sbx_other_dead"]
