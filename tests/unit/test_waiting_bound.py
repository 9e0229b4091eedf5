"""core/waiting.py's bookkeeping, without a server: the default bound is a share of the
open-file limit its caller reads (core makes no system call), and shedding closes the
longer-waiting half of the waiting connections, none with a request under way."""

from __future__ import annotations

from hutch.core.waiting import MOST_WAITING, WaitingBound, default_waiting


def test_the_default_bound_is_a_quarter_of_the_open_file_limit_passed_in() -> None:
    assert default_waiting(1024) == 256
    assert default_waiting(3) == 1
    assert default_waiting(10**6) == MOST_WAITING
    assert default_waiting(None) == MOST_WAITING  # unlimited


def test_shedding_closes_the_longer_waiting_half_and_no_busy_connection() -> None:
    since: dict[str, float | None] = {"busy": None, "d": 4.0, "a": 1.0, "c": 3.0, "b": 2.0}
    closed: list[str] = []
    bound: WaitingBound[str] = WaitingBound(100, since.get, closed.append)
    for conn in since:
        bound.made(conn)
    assert bound.shed() == 2
    assert closed == ["a", "b"]
