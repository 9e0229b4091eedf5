from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from hutch.core import ids
from hutch.core.events import EVENT_TYPES, Event, ExecutionFinished, SandboxCreated, decode, encode
from hutch.core.models import (
    ExecutionStatus,
    Mode,
    NetworkSpec,
    ResourceSpec,
    SandboxSpec,
    TimeoutSpec,
)


def test_ids_carry_the_seeds_prefixes() -> None:
    for kind, prefix in [("sandbox", "sbx_"), ("execution", "exec_"), ("job", "job_"), ("snapshot", "snp_"),
                         ("checkpoint", "ckpt_"), ("runtime", "srt_"), ("event", "evt_")]:
        value = ids.new_id(kind)
        assert value.startswith(prefix) and ids.is_id(kind, value)
    assert not ids.is_id("sandbox", "exec_" + "0" * 26)


@given(st.integers(min_value=0, max_value=2**47), st.integers(min_value=0, max_value=2**47))
def test_ids_sort_by_time(a: int, b: int) -> None:
    ia = ids.new_id("sandbox", now_ms=a, random_bytes=b"\xff" * 10)
    ib = ids.new_id("sandbox", now_ms=b, random_bytes=b"\x00" * 10)
    if a < b:
        assert ia < ib
    elif a > b:
        assert ia > ib


def test_event_type_names_are_stable() -> None:
    # These strings are on the wire and in stored logs: changing one breaks both.
    assert set(EVENT_TYPES) == {
        "create", "runtime:build", "destroy", "lifecycle:started", "lifecycle:moved", "lifecycle:failed", "lifecycle:discarded", "lifecycle:completed",
        "lifecycle:terminated", "pause", "resume", "env", "timeout", "network", "checkpoint", "checkpoint:restored", "checkpoint:deleted", "execution:started", "execution:finished",
        "snapshot", "snapshot:finalized", "snapshot:tagged", "snapshot:deleted",
        "org:created", "org:quota", "project:created", "key:created", "key:revoked", "sshkey:added", "sshkey:removed",
    }


text = st.text(min_size=1, max_size=20)
specs = st.builds(
    SandboxSpec,
    runtime=text, runtime_id=text, mode=st.sampled_from(Mode), name=st.none() | text,
    resources=st.builds(ResourceSpec, memory=st.none() | text, memory_bytes=st.none() | st.integers(1, 2**40)),
    env=st.dictionaries(text, text, max_size=4), network=st.builds(NetworkSpec, enabled=st.booleans()),
    timeout=st.builds(TimeoutSpec, idle=st.none() | text),
    command=st.none() | st.lists(text, min_size=1, max_size=4).map(tuple),
    metadata=st.none() | st.dictionaries(text, st.recursive(
        st.none() | st.booleans() | st.integers() | text,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3), max_leaves=8), max_size=3),
)


@given(specs)
def test_create_events_round_trip_through_json(spec: SandboxSpec) -> None:
    ev = Event("evt_1", "sbx_1", "2026-01-01T00:00:00.000Z", SandboxCreated(spec=spec, api_key_id="key_1"))
    assert decode(json.loads(json.dumps(encode(ev)))) == ev


@given(st.sampled_from(ExecutionStatus), st.none() | st.integers(-1, 255), st.booleans())
def test_finish_events_round_trip(status: ExecutionStatus, code: int | None, truncated: bool) -> None:
    ev = Event("evt_2", "sbx_1", "t", ExecutionFinished("exec_1", status, exit_code=code, output_truncated=truncated))
    assert decode(json.loads(json.dumps(encode(ev)))) == ev
