"""Crash points for the chaos tests: with ``HUTCH_CRASH_AT=NAME`` the server kills itself
with SIGKILL (no ``finally``, no shutdown, as a host losing power) when it reaches the point
named NAME, or with ``HUTCH_CRASH_AT=NAME:SECONDS`` holds that one request there that long
(the event loop runs on: the lease is renewed, as a slow append is waited for), or with
``HUTCH_CRASH_AT=NAME:stop`` stops itself there with SIGSTOP (the whole process frozen, its
lease renewals too, as a paused VM or a host swapping; the test resumes it with SIGCONT).
Unset, as it always is outside tests/system, a point is one comparison.

The points (each where a test needs the process gone):
- ``create-made-unrecorded``: the driver made a new sandbox, its Create + Start not appended
  yet (service/provisioning.py): the window in which a lost replica leaves a sandbox no
  event records (tests/system/test_node_orphan.py).
- ``create-made-unhandled``: the same, before its handle is written to its owner row: a
  nomad sandbox taken from a warm pool is then known only as a pool job of the lost replica
  (tests/system/test_nomad_orphan.py).
- ``create-vouched-unrecorded``: the same sandbox, its replica's lease vouched for, its append
  about to begin: with ``:stop``, an append that lands after the lease lapsed and a survivor
  ended the sandbox (the same test).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys

_SETTING = os.environ.get("HUTCH_CRASH_AT", "")
_POINT, _, _HOLD = _SETTING.partition(":")


async def crash_point(name: str) -> None:
    if not _POINT or name != _POINT:
        return
    if _HOLD == "stop":
        print(f"hutch: HUTCH_CRASH_AT: stopped at {name}", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)
        return
    if _HOLD:
        print(f"hutch: HUTCH_CRASH_AT: holding at {name} for {_HOLD} s", file=sys.stderr, flush=True)
        await asyncio.sleep(float(_HOLD))
        return
    print(f"hutch: HUTCH_CRASH_AT: killed at {name}", file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
