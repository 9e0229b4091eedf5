"""hutch's envd codec (api/e2b/codec.py) against the protobuf classes E2B's SDK generates from
the same .proto: both encodings, both ways, byte for byte where protobuf is deterministic."""

from __future__ import annotations

import json

import pytest
from e2b.envd.process import process_pb as pb
from protobuf import Oneof

from hutch.api.e2b import codec
from hutch.api.e2b import process_messages as msg
from hutch.core.errors import InvalidInput

START = pb.StartRequest(process=pb.ProcessConfig(cmd="/bin/bash", args=["-l", "-c", "echo hi"], envs={"A": "b"},
                                                 cwd="/tmp"), tag="web", stdin=True)
START_DICT = {"process": {"cmd": "/bin/bash", "args": ["-l", "-c", "echo hi"], "envs": {"A": "b"}, "cwd": "/tmp"},
              "tag": "web", "stdin": True}


@pytest.mark.parametrize("is_json", [False, True])
def test_a_start_request_the_sdk_encodes_is_read(is_json: bool) -> None:
    raw = START.to_json().encode() if is_json else START.to_binary()
    assert codec.decode(msg.START_REQUEST, raw, is_json) == START_DICT


@pytest.mark.parametrize("event", [
    {"start": {"pid": 1001}},
    {"data": {"stdout": b"out\xff\x00"}},
    {"data": {"stderr": b""}},
    {"end": {"exit_code": -1, "exited": False, "status": "signal: killed", "error": "boom"}},
    {"end": {"exit_code": 3, "exited": True, "status": "exit status 3"}},
    {"keepalive": {}},
])
@pytest.mark.parametrize("is_json", [False, True])
def test_the_events_hutch_writes_are_what_the_sdk_reads(event: dict, is_json: bool) -> None:  # type: ignore[type-arg]
    raw = codec.encode(msg.EVENT_RESPONSE, {"event": event}, is_json)
    theirs = pb.StartResponse.from_json(raw.decode()) if is_json else pb.StartResponse.from_binary(raw)
    (name, fields), = event.items()
    chosen = theirs.event.event  # the ProcessEvent's oneof, as the SDK matches on it
    assert chosen.field == name
    if name == "data":  # a oneof inside: the stream the bytes came on
        (stream, data), = fields.items()
        assert (chosen.value.output.field, chosen.value.output.value) == (stream, data)
    for key, value in fields.items() if name != "data" else ():
        assert getattr(chosen.value, key) == value


def test_a_process_list_and_a_signal_round_trip() -> None:
    listing = {"processes": [{"config": {"cmd": "sleep", "args": ["9"], "envs": {}, "cwd": None}, "pid": 1000},
                             {"config": {"cmd": "top"}, "pid": 1001, "tag": "t"}]}
    theirs = pb.ListResponse.from_binary(codec.encode(msg.LIST_RESPONSE, listing, False))
    assert [(p.pid, p.config.cmd, list(p.config.args)) for p in theirs.processes] == [(1000, "sleep", ["9"]),
                                                                                        (1001, "top", [])]
    signal = pb.SendSignalRequest(process=pb.ProcessSelector(selector=Oneof("pid", 1000)), signal=pb.Signal.SIGKILL)
    assert codec.decode(msg.SEND_SIGNAL_REQUEST, signal.to_binary(), False) == {"process": {"pid": 1000}, "signal": 9}
    assert json.loads(signal.to_json())["signal"] == "SIGNAL_SIGKILL"
    assert codec.decode(msg.SEND_SIGNAL_REQUEST, signal.to_json().encode(), True)["signal"] == 9


@pytest.mark.parametrize(("raw", "is_json", "words"), [
    (b"\x0a\x05abc", False, "runs past the end"),
    (b"\x0f", False, "wire type 7"),
    (b'{"process": "x"}', True, "process: expected a JSON object"),
    (b'{"process": {"args": "ls"}}', True, "process.args: expected a list"),
    (b'{"tag": 5}', True, "tag: expected a string"),
    (b"{", True, "invalid JSON"),
])
def test_a_malformed_message_is_refused_naming_what_is_wrong(raw: bytes, is_json: bool, words: str) -> None:
    with pytest.raises(InvalidInput, match=words):
        codec.decode(msg.START_REQUEST, raw, is_json)


@pytest.mark.parametrize(("given", "short"), [("0" * 5000 + "7", "7"), ("-" + "0" * 5000 + "7", "-7")])
def test_a_number_zero_padded_past_4300_digits_is_read_as_its_value(given: str, short: str) -> None:
    """int() of more than 4,300 digits raises ValueError (a 500): the zeros before a number
    are not its digits, so "00…07" is read as "7" is, as a shorter padding was already."""
    def cols(value: str) -> object:
        raw = json.dumps({"pty": {"size": {"cols": value, "rows": 5}}}).encode()
        return codec.decode(msg.START_REQUEST, raw, True)["pty"]["size"]["cols"]
    assert cols(given) == cols(short)
