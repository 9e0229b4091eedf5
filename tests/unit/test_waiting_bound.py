"""core/waiting.py's bookkeeping, without a server: the default bound is a share of the
open-file limit its caller reads (core makes no system call)."""

from __future__ import annotations

from hutch.core.waiting import MOST_WAITING, default_waiting


def test_the_default_bound_is_a_quarter_of_the_open_file_limit_passed_in() -> None:
    assert default_waiting(1024) == 256
    assert default_waiting(3) == 1
    assert default_waiting(10**6) == MOST_WAITING
    assert default_waiting(None) == MOST_WAITING  # unlimited

