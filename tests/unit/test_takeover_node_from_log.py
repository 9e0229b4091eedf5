"""A take-over of a sandbox whose node the log records (lifecycle:started carries it on the
node driver) adopts it without a handle row: the create no longer writes one (a PostgreSQL
statement in series on its way to idle), the log says where it runs."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

from hutch.core.models import Mode, SandboxStatus
from hutch.service.takeover import Takeover


class _Adoption:
    def __init__(self) -> None:
        self.asked: list[tuple[str, dict[str, str]]] = []

    async def adopt(self, sandbox: Any, handle: dict[str, str]) -> bool:
        self.asked.append((sandbox.sandbox_id, handle))
        return sandbox.node == "n1"


def _takeover(sb: Any, adoption: _Adoption, scheduled: list[str]) -> Takeover:
    async def last_position() -> int:
        return 0

    async def wait_for(position: int) -> None:
        return None

    async def get_sandbox(sandbox_id: str) -> Any:
        return sb

    async def list_executions(sandbox_id: str) -> list[Any]:
        return []

    async def schedule(sandbox_id: str) -> None:
        scheduled.append(sandbox_id)

    n = cast(Any, None)
    return Takeover(log=cast(Any, SimpleNamespace(last_position=last_position)),
                    store=cast(Any, SimpleNamespace(get_sandbox=get_sandbox, list_executions=list_executions)),
                    projector=cast(Any, SimpleNamespace(wait_for=wait_for)), reads=n, recorder=n, control=n,
                    reaper=cast(Any, SimpleNamespace(schedule=schedule)), lifecycle=n,
                    adoption=cast(Any, adoption))


async def test_a_sandbox_the_log_places_on_a_node_is_adopted_without_a_handle() -> None:
    sb = SimpleNamespace(sandbox_id="sbx_1", node="n1", status=SandboxStatus.IDLE,
                         spec=SimpleNamespace(mode=Mode.INTERACTIVE))
    adoption, scheduled = _Adoption(), []
    assert await _takeover(sb, adoption, scheduled).adopt("sbx_1", None, "replica r2 was lost") is True
    assert adoption.asked == [("sbx_1", {})] and scheduled == ["sbx_1"]
