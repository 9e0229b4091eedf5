"""The local driver's admission (drivers/local/admission.py): what it counts, holds and frees,
on a host whose memory is given (MemTotal, MemAvailable) instead of read."""

from __future__ import annotations

import pytest

from hutch.core.driver_types import ResourceLimits
from hutch.core.errors import NoCapacity
from hutch.drivers.local import admission
from hutch.drivers.local.admission import HostAdmission, HostLimits

GiB = 1 << 30
HALF = ResourceLimits(memory_bytes=GiB // 2)


def host(total: int = 16 * GiB, available: int = 8 * GiB, **limits: int) -> HostAdmission:
    return HostAdmission(HostLimits(**limits), memory=lambda: (total, available))


def test_holds_count_until_made_and_ends_free_the_room() -> None:
    a = host(max_sandboxes=2)
    a.reserve("one", HALF)
    a.reserve("one", HALF)  # idempotent: a retried create keeps its hold, takes no second
    a.reserve("two", HALF)
    with pytest.raises(NoCapacity, match="the host runs its maximum of 2 sandboxes") as caught:
        a.reserve("three", HALF)
    assert (caught.value.status, caught.value.code) == (503, "NO_CAPACITY")
    a.made("one", HALF)
    a.release("two")  # its create failed before the sandbox was made
    a.reserve("three", HALF)
    a.ended("one")
    a.reserve("four", HALF)


def test_memory_is_counted_against_the_commit_limit_and_what_is_available() -> None:
    a = host(memory_limit=GiB)
    a.reserve("one", HALF)
    a.reserve("two", ResourceLimits())  # no limit given: counted as the default, 512Mi
    with pytest.raises(NoCapacity, match="of 512Mi memory: the host has 0Gi memory free"):
        a.reserve("three", HALF)
    with pytest.raises(NoCapacity, match="of 9Gi memory: the host has 8Gi memory free"):
        host().reserve("big", ResourceLimits(memory_bytes=9 * GiB))


def test_creates_at_once_count_as_committed_not_as_memory_gone() -> None:
    """As many as one after another: a hold's limit is not taken from MemAvailable."""
    a = host(total=24 * GiB, available=20 * GiB)
    for i in range(64):
        a.reserve(f"at-once-{i}", HALF)


def test_a_hold_lapses_and_a_recount_replaces_the_count(monkeypatch: pytest.MonkeyPatch) -> None:
    a = host(max_sandboxes=1)
    a.reserve("one", HALF)
    monkeypatch.setattr(admission, "RESERVATION", -1.0)  # the next hold lapses at once
    with pytest.raises(NoCapacity):
        a.reserve("two", HALF)
    a.release("one")
    a.reserve("two", HALF)  # lapsed at once
    a.reserve("three", HALF)
    assert not a.counted
    a.count({"adopted": HALF})  # an earlier server's sandbox, found by alive()
    assert a.counted
    with pytest.raises(NoCapacity):
        a.reserve("four", HALF)
    a.ended("adopted")
    a.reserve("four", HALF)


def test_a_host_at_its_bound_grows_no_spares() -> None:
    """The warm pool's idle sandboxes count beside the sandboxes and holds (pool.py asks first)."""
    a = host(max_sandboxes=3)
    a.made("live", HALF)
    assert a.spare("p1", GiB // 2) and a.spare("p2", GiB // 2)
    assert not a.spare("p3", GiB // 2), "a third spare past a bound of 3 with one sandbox"
    a.spare_gone("p2")
    a.reserve("held", HALF)
    assert not a.spare("p3", GiB // 2), "a create's hold counts against a refill too"
    m = host(memory_limit=GiB)
    m.made("live", HALF)
    assert m.spare("p1", GiB // 2)
    assert not m.spare("p2", None), "no memory limit left: counted as the default, 512Mi"


def test_a_create_that_claims_a_spare_is_admitted_and_counted_once() -> None:
    a = host(max_sandboxes=2)
    assert a.spare("p1", GiB // 2) and a.spare("p2", GiB // 2)
    a.reserve("one", HALF)  # a create is not refused for spares: they are the room it takes
    a.spare_gone("p1")  # claimed: the hold counts it from here
    a.made("one", HALF)
    assert a.surplus() == []  # one sandbox and one spare: at the bound, not past it
    a.reserve("two", HALF)
    a.spare_gone("p2")
    a.made("two", HALF)
    with pytest.raises(NoCapacity, match="maximum of 2 sandboxes"):
        a.reserve("three", HALF)  # had the claim counted twice, "two" would have been refused
    assert not a.spare("p3", GiB // 2)


def test_spares_past_the_bound_after_a_create_from_scratch_are_named_newest_first() -> None:
    a = host(max_sandboxes=2)
    assert a.spare("p1", GiB // 2) and a.spare("p2", GiB // 2)
    a.reserve("big", ResourceLimits(memory_bytes=GiB))  # its size fits no spare: made from scratch
    a.made("big", ResourceLimits(memory_bytes=GiB))
    assert a.surplus() == ["p2"]
    a.spare_gone("p2")
    assert a.surplus() == []
    m = host(memory_limit=2 * GiB)
    assert m.spare("p1", GiB // 2) and m.spare("p2", GiB // 2)
    m.reserve("big", ResourceLimits(memory_bytes=GiB + GiB // 2))
    m.made("big", ResourceLimits(memory_bytes=GiB + GiB // 2))
    assert m.surplus() == ["p2"]  # 1.5Gi + 2 x 512Mi: 512Mi past 2Gi
    m.made("more", ResourceLimits(memory_bytes=GiB // 4))
    assert m.surplus() == ["p2", "p1"]  # 1.75Gi + 2 x 512Mi: both go


def test_a_hold_waiting_on_a_long_step_does_not_lapse(monkeypatch: pytest.MonkeyPatch) -> None:
    """A create whose runtime is built first, or its install layer: its hold stays while it
    waits, and lapses ``RESERVATION`` after the step ends (``renew``), not after it was taken."""
    building: set[str] = {"python:3.13"}
    a = HostAdmission(HostLimits(max_sandboxes=1), memory=lambda: (16 * GiB, 8 * GiB),
                      busy=lambda sid, runtime: runtime in building)
    monkeypatch.setattr(admission, "RESERVATION", -1.0)  # every hold lapses at once unless busy
    a.reserve("waits", HALF, "python:3.13")
    with pytest.raises(NoCapacity, match="maximum of 1 sandboxes"):
        a.reserve("after", HALF, "base:latest")  # the build goes on: the room stays held
    monkeypatch.setattr(admission, "RESERVATION", 60.0)
    building.clear()
    a.renew(runtime="python:3.13")  # the build ended: its creates' holds count from now
    with pytest.raises(NoCapacity, match="maximum of 1 sandboxes"):
        a.reserve("after", HALF, "base:latest")
    a.made("waits", HALF)
    a.ended("waits")
    a.reserve("after", HALF, "base:latest")
