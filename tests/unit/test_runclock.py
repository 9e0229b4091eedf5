"""The drivers' run clock (local and nomad): a command's time limit stands still while its
sandbox is frozen, and runs on once it thaws."""

from __future__ import annotations

import asyncio
import time

from hutch.drivers.runclock import RunClock, sleep, within


async def test_the_limit_does_not_run_out_while_frozen_and_does_once_thawed() -> None:
    clock, never = RunClock(), asyncio.get_running_loop().create_future()
    clock.freeze()
    t0 = time.monotonic()
    waiting = asyncio.ensure_future(within(never, 0.2, clock))
    await asyncio.sleep(0.5)  # frozen: 0.5 s of wall clock, none of the run clock
    assert not waiting.done()
    clock.thaw()
    assert await waiting is False  # ran out 0.2 s of run clock after the thaw
    assert time.monotonic() - t0 >= 0.7
    assert not never.done()  # the awaited thing is the caller's: not cancelled


async def test_what_ends_in_time_comes_back_and_no_limit_waits_for_it() -> None:
    clock = RunClock()
    assert await within(asyncio.sleep(0.05), 5, clock) is True
    assert await within(asyncio.sleep(0.05), None, clock) is True
    clock.freeze()
    clock.freeze()  # idempotent: counted from the first
    at = clock()
    await asyncio.sleep(0.1)
    assert clock() == at and clock.frozen
    clock.thaw()
    clock.thaw()
    assert not clock.frozen and clock() - at < 0.05


async def test_a_sleep_on_the_run_clock_stands_still_while_frozen() -> None:
    """The nomad driver's command deadline: 0.3 s of run clock, frozen 0.4 s after 0.1 s."""
    clock = RunClock()
    t0 = time.monotonic()
    sleeping = asyncio.ensure_future(sleep(0.3, clock))
    await asyncio.sleep(0.1)
    clock.freeze()
    await asyncio.sleep(0.4)  # past its 0.3 s of wall clock: frozen, it sleeps on
    assert not sleeping.done()
    clock.thaw()
    await sleeping
    assert 0.7 <= time.monotonic() - t0 < 1.2
