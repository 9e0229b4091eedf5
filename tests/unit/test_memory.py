"""api/memory.py: glibc's arenas capped and its free heap trimmed; a no-op without glibc."""

from __future__ import annotations

import asyncio
import ctypes
import platform

import pytest
from aiohttp import web

from hutch.api import memory


class FakeLibc:
    """Records the calls; answers as glibc does (mallopt: 1 applied; malloc_trim: 1 released)."""

    def __init__(self, mallopt_ok: int = 1) -> None:
        self.mallopt_calls: list[tuple[int, int]] = []
        self.trims: list[int] = []
        self.trimmed = asyncio.Event()
        self._mallopt_ok = mallopt_ok

    def mallopt(self, param: ctypes.c_int, value: ctypes.c_int) -> int:
        self.mallopt_calls.append((param.value, value.value))
        return self._mallopt_ok

    def malloc_trim(self, pad: ctypes.c_size_t) -> int:
        self.trims.append(pad.value)
        if len(self.trims) >= 3:
            self.trimmed.set()
        return 1


def test_glibc_is_found_where_it_is_the_c_library() -> None:
    assert (memory.LIBC is not None) == (platform.libc_ver()[0] == "glibc")


def test_the_real_calls_succeed_on_glibc() -> None:
    if memory.LIBC is None:
        assert not memory.limit_arenas() and not memory.trim()
        return
    assert memory.limit_arenas() is True  # glibc accepted M_ARENA_MAX
    assert memory.trim() in (True, False)  # returns, whether or not it had pages to give back


def test_arenas_are_capped_at_two(monkeypatch: pytest.MonkeyPatch) -> None:
    libc = FakeLibc()
    monkeypatch.setattr(memory, "LIBC", libc)
    assert memory.limit_arenas() is True
    assert libc.mallopt_calls == [(memory.M_ARENA_MAX, 2)]


def test_a_refused_cap_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory, "LIBC", FakeLibc(mallopt_ok=0))
    assert memory.limit_arenas() is False


def test_trim_gives_back_everything_free(monkeypatch: pytest.MonkeyPatch) -> None:
    libc = FakeLibc()
    monkeypatch.setattr(memory, "LIBC", libc)
    assert memory.trim() is True
    assert libc.trims == [0]  # pad 0: keep nothing spare at the top of the heap


def test_without_glibc_both_are_no_ops(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory, "LIBC", None)
    assert memory.limit_arenas() is False
    assert memory.trim() is False


async def test_the_server_trims_while_it_serves_and_stops_on_cleanup(monkeypatch: pytest.MonkeyPatch) -> None:
    libc = FakeLibc()
    monkeypatch.setattr(memory, "LIBC", libc)
    monkeypatch.setattr(memory, "TRIM_EVERY_S", 0.0)
    ctx = memory.trim_ctx(web.Application())
    await anext(ctx)
    await libc.trimmed.wait()  # trims again and again, not once
    with pytest.raises(StopAsyncIteration):
        await anext(ctx)
    done = len(libc.trims)
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert len(libc.trims) == done  # cancelled: no trim after the cleanup


async def test_without_glibc_the_server_starts_no_trimming(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory, "LIBC", None)
    ctx = memory.trim_ctx(web.Application())
    before = asyncio.all_tasks()
    await anext(ctx)
    assert asyncio.all_tasks() == before
    with pytest.raises(StopAsyncIteration):
        await anext(ctx)
