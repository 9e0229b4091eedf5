"""A log record no reader can decode becomes an ``UnreadableRecord`` event, never an exception
(core.events.decode_or_unreadable), and every projection store refuses it on its own, so it is
recorded as skipped instead of stopping the projector at its position."""

from __future__ import annotations

import json

import pytest

from hutch.core.events import Event, SandboxCreated, UnreadableRecord, decode_or_unreadable, encode
from hutch.core.models import SandboxSpec
from hutch.projections.base import EventRefused, fold


def good() -> Event:
    spec = SandboxSpec(runtime="base:latest", runtime_id="srt_x")
    return Event("evt_1", "sbx_1", "2026-01-01T00:00:00.000Z", SandboxCreated(spec=spec))


def test_a_readable_record_decodes_as_before() -> None:
    event = good()
    assert decode_or_unreadable(json.dumps(encode(event)).encode(), 7) == Event(
        event.event_id, event.sandbox_id, event.created_at, event.data, position=7, actor=event.actor)


@pytest.mark.parametrize(("raw", "event_id", "sandbox_id", "reason"), [
    (b"\xffnot json", "unreadable-3", "", "UnicodeDecodeError"),
    (b"[1, 2]", "unreadable-3", "", "TypeError"),
    (json.dumps({"eventId": "evt_9", "sandboxId": "sbx_9", "type": "from-the-future",
                 "createdAt": "2030-01-01T00:00:00.000Z", "data": {}}).encode(),
     "evt_9", "sbx_9", "unknown event type 'from-the-future'"),
    (json.dumps({"eventId": "evt_8", "sandboxId": 42, "type": "create", "data": {"spec": "nope"}}).encode(),
     "evt_8", "", ""),
    (json.dumps({"type": "create", "data": {}}).encode(), "unreadable-3", "", ""),
])
def test_an_unreadable_record_keeps_what_it_can(raw: bytes, event_id: str, sandbox_id: str, reason: str) -> None:
    event = decode_or_unreadable(raw, 3)
    assert isinstance(event.data, UnreadableRecord)
    assert (event.event_id, event.sandbox_id, event.position, event.type) == (event_id, sandbox_id, 3, "log:unreadable")
    assert reason in event.data.reason
    assert event.data.record == raw.decode("utf-8", "replace")


def test_the_kept_text_is_bounded() -> None:
    event = decode_or_unreadable(b"x" * 100_000, 1)
    assert isinstance(event.data, UnreadableRecord) and len(event.data.record) == 4096


def test_folding_an_unreadable_record_is_refused_and_changes_nothing() -> None:
    sandboxes: dict = {}
    executions: dict = {}
    with pytest.raises(EventRefused, match="position 5 cannot be read"):
        fold(sandboxes, executions, {}, decode_or_unreadable(b"garbage", 5))
    assert sandboxes == {} and executions == {}
