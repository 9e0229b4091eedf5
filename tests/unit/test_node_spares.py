"""The agent's admission counts its warm pool's spares (hutch/node/sandboxes.py Admission, as
the pool asks it: drivers/local/pool.py SpareRoom). The real agent and pool:
tests/isolation/test_node_admission.py; here the bookkeeping the isolation test does not reach
(the commit limit, a create made from scratch beside spares, a draining node)."""

from __future__ import annotations

from pathlib import Path

from hutch.core.driver_types import ResourceLimits
from hutch.node.census import Census
from hutch.node.config import NodeSettings
from hutch.node.drain import Drain
from hutch.node.sandboxes import Admission

GiB = 1 << 30


class _Driver:
    """What the census reads of the local driver: the live sandboxes and their limits."""

    def __init__(self, live: dict[str, int]) -> None:
        self.live = live

    async def alive(self) -> set[str]:
        return set(self.live)

    def limits(self, sandbox_id: str) -> ResourceLimits:
        return ResourceLimits(memory_bytes=self.live[sandbox_id])


async def _admission(tmp_path: Path, live: dict[str, int], drain: Drain | None = None,
                     **limits: int) -> Admission:
    settings = NodeSettings(name="s1", host="127.0.0.1", port=0, data_dir=tmp_path, runtime_cache=tmp_path,
                            secret=b"s" * 32, **limits)
    census = Census()
    admission = Admission(settings, census, drain or Drain(tmp_path))
    assert not admission.spare("early", GiB // 2), "a spare before the node's first count"
    await census.current(_Driver(live))  # type: ignore[arg-type]
    return admission


async def test_spares_fill_the_bound_beside_sandboxes_and_creates_under_way(tmp_path: Path) -> None:
    a = await _admission(tmp_path, {"one": GiB // 2}, max_sandboxes=3)
    a.starting["two"] = (GiB // 2, 0)
    assert a.spare("p1", GiB // 2)
    assert not a.spare("p2", GiB // 2), "a fourth at a bound of 3"
    a.spare_gone("p1")  # claimed by a create, which ``starting`` counts
    assert a.spare("p2", GiB // 2)
    assert a.surplus() == []


async def test_spares_past_the_commit_limit_after_a_create_from_scratch_go_newest_first(tmp_path: Path) -> None:
    a = await _admission(tmp_path, {}, memory_limit=2 * GiB)
    assert a.spare("p1", GiB // 2) and a.spare("p2", GiB // 2)
    a.starting["big"] = (GiB + GiB // 2, 0)  # its size fits no spare: made from scratch
    assert a.surplus() == ["p2"]  # 1.5Gi + 2 x 512Mi: 512Mi past 2Gi
    a.starting["more"] = (GiB // 4, 0)
    assert a.surplus() == ["p2", "p1"]
    a.spare_gone("p2")
    a.spare_gone("p1")
    assert a.surplus() == []


async def test_a_draining_node_grows_no_spares(tmp_path: Path) -> None:
    drain = Drain(tmp_path)
    a = await _admission(tmp_path, {}, drain)
    assert a.spare("p1", GiB // 2)
    drain.set(True)
    assert not a.spare("p2", GiB // 2)
