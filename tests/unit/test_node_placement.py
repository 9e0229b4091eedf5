"""Where the node driver places a sandbox (drivers/node/placement.py, pure)."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from hutch.core.driver_types import ResourceLimits
from hutch.core.errors import InvalidInput, NoCapacity
from hutch.drivers.node.placement import NodeState, choose

GiB = 1 << 30


def node(name: str, *, free: int = 8 * GiB, committed: int = 0, cpus: int = 4, cpu: int = 0,
         runtimes: frozenset[str] = frozenset({"base:latest"}), unusable: str | None = None) -> NodeState:
    return NodeState(name=name, cpus=cpus, memory_total=16 * GiB, memory_available=free, memory_committed=committed,
                     cpu_committed_millis=cpu, runtimes=runtimes, unusable=unusable)


def test_spread_goes_to_the_least_committed() -> None:
    nodes = [node("a", committed=4 * GiB), node("b", committed=1 * GiB), node("c", committed=2 * GiB)]
    assert choose(nodes, ResourceLimits(), "base:latest") == "b"


def test_equal_nodes_share_equal_sandboxes() -> None:
    """Placing 24 one after another, each counted as committed: 8/8/8."""
    committed = {"a": 0, "b": 0, "c": 0}
    rng = random.Random(7)
    for _ in range(24):
        nodes = [node(n, committed=c) for n, c in committed.items()]
        committed[choose(nodes, ResourceLimits(memory_bytes=GiB), "base:latest", rng=rng)] += GiB
    assert Counter(committed.values()) == {8 * GiB: 3}


def test_ties_are_broken_at_random() -> None:
    nodes = [node("a"), node("b")]
    picked = {choose(nodes, ResourceLimits(), "base:latest", rng=random.Random(seed)) for seed in range(20)}
    assert picked == {"a", "b"}


def test_a_node_with_the_runtime_built_comes_first() -> None:
    nodes = [node("a", runtimes=frozenset()), node("b", committed=6 * GiB, runtimes=frozenset({"python:3.13"}))]
    assert choose(nodes, ResourceLimits(), "python:3.13") == "b"


def test_resources_are_honoured_against_free_capacity() -> None:
    nodes = [node("small", free=1 * GiB), node("big", free=8 * GiB, committed=7 * GiB)]
    assert choose(nodes, ResourceLimits(memory_bytes=4 * GiB), "base:latest") == "big"
    # this driver's own reservations count as taken
    with pytest.raises(NoCapacity):
        choose(nodes, ResourceLimits(memory_bytes=4 * GiB), "base:latest", {"big": (5 * GiB, 0, 1)})


def test_none_fits_names_every_node() -> None:
    nodes = [node("c1", free=1 * GiB), node("c2", cpus=1), node("c3", unusable="did not answer (refused)")]
    with pytest.raises(NoCapacity) as caught:
        choose(nodes, ResourceLimits(memory_bytes=2 * GiB, cpu_millis=2000), "base:latest")
    err = caught.value
    assert (err.status, err.code, err.retriable) == (503, "NO_CAPACITY", True)
    assert err.message == ("no node can take a sandbox of 2Gi memory and 2000m cpu: c1 has 1Gi memory free; "
                           "c2 has 1000m cpu in all; c3 did not answer (refused)")


def test_no_node_at_all() -> None:
    with pytest.raises(NoCapacity, match="no node agent is known"):
        choose([], ResourceLimits(), "base:latest")


def test_a_node_at_its_sandbox_cap_takes_no_more() -> None:
    nodes = [NodeState(name="a", cpus=4, memory_total=16 * GiB, memory_available=8 * GiB, sandboxes=1, max_sandboxes=2),
             NodeState(name="b", cpus=4, memory_total=16 * GiB, memory_available=8 * GiB, sandboxes=2, max_sandboxes=2)]
    assert choose(nodes, ResourceLimits(), "base:latest") == "a"
    with pytest.raises(NoCapacity, match="a runs its maximum of 2 sandboxes; b runs its maximum of 2 sandboxes"):
        choose(nodes, ResourceLimits(), "base:latest", {"a": (0, 0, 1)})


def test_a_nodes_own_memory_commit_limit_is_its_bound() -> None:
    """HUTCH_MEMORY_COMMIT_LIMIT on its agent, instead of 32x its memory in limits."""
    limited = NodeState(name="a", cpus=4, memory_total=16 * GiB, memory_available=8 * GiB, memory_committed=3 * GiB,
                        memory_limit=4 * GiB)
    assert choose([limited], ResourceLimits(memory_bytes=GiB), "base:latest") == "a"
    with pytest.raises(NoCapacity, match="a has 1Gi memory free"):
        choose([limited], ResourceLimits(memory_bytes=2 * GiB), "base:latest")


def test_a_size_no_node_could_hold_even_empty_is_a_400_naming_the_most() -> None:
    """More than every node's memory (or its commit limit): no wait helps, so not a 503, which
    the Agentuity client retries for ~30 s; a full node stays a 503."""
    limited = NodeState(name="b", cpus=4, memory_total=16 * GiB, memory_available=16 * GiB, memory_limit=4 * GiB)
    nodes = [node("a", free=1 * GiB, committed=15 * GiB), limited]
    for asked in (4096 * GiB, 17 * GiB):
        with pytest.raises(InvalidInput) as caught:
            choose(nodes, ResourceLimits(memory_bytes=asked), "base:latest")
        err = caught.value
        assert (err.status, err.code, err.field, err.retriable) == (400, "INVALID_INPUT", "resources.memory", False)
        assert err.message.startswith("resources.memory: ") and err.message.endswith(
            "is more than any sandbox can have on any node (at most 16Gi)"), err.message
    with pytest.raises(InvalidInput, match=r"\(at most 4Gi\)"):  # b's commit limit bounds b
        choose([limited], ResourceLimits(memory_bytes=5 * GiB), "base:latest")
    # 16Gi fits node a empty: a 503 while it is full, as any full cluster
    with pytest.raises(NoCapacity):
        choose(nodes, ResourceLimits(memory_bytes=16 * GiB), "base:latest")
    # a node whose figures are unknown (never answered) might hold it: a 503
    with pytest.raises(NoCapacity):
        choose([*nodes, NodeState(name="c", unusable="did not answer")], ResourceLimits(memory_bytes=4096 * GiB),
               "base:latest")
