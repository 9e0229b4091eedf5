"""envd's process messages (e2b-dev/E2B spec/envd/process/process.proto), as schemas for
api/e2b/codec.py: field name -> (number, kind, what)."""

from __future__ import annotations

from hutch.api.e2b.codec import Schema

SIGNALS = {"SIGNAL_UNSPECIFIED": 0, "SIGNAL_SIGTERM": 15, "SIGNAL_SIGKILL": 9}

PROCESS_CONFIG: Schema = {"cmd": (1, "string", None), "args": (2, "repeated", "string"),
                          "envs": (3, "map", None), "cwd": (4, "string", None)}
PTY: Schema = {"size": (1, "message", {"cols": (1, "uint32", None), "rows": (2, "uint32", None)})}
START_REQUEST: Schema = {"process": (1, "message", PROCESS_CONFIG), "pty": (2, "message", PTY),
                         "tag": (3, "string", None), "stdin": (4, "bool", None)}
SELECTOR: Schema = {"pid": (1, "uint32", None), "tag": (2, "string", None)}
CONNECT_REQUEST: Schema = {"process": (1, "message", SELECTOR)}
SEND_SIGNAL_REQUEST: Schema = {"process": (1, "message", SELECTOR), "signal": (2, "enum", SIGNALS)}
EMPTY: Schema = {}
PROCESS_INFO: Schema = {"config": (1, "message", PROCESS_CONFIG), "pid": (2, "uint32", None),
                        "tag": (3, "string", None)}
LIST_RESPONSE: Schema = {"processes": (1, "repeated", PROCESS_INFO)}
# ``repeated`` takes a scalar kind or a schema: a list of messages names the schema itself.
PROCESS_EVENT: Schema = {
    "start": (1, "message", {"pid": (1, "uint32", None)}),
    "data": (2, "message", {"stdout": (1, "bytes", None), "stderr": (2, "bytes", None), "pty": (3, "bytes", None)}),
    "end": (3, "message", {"exit_code": (1, "sint32", None), "exited": (2, "bool", None),
                           "status": (3, "string", None), "error": (4, "string", None)}),
    "keepalive": (4, "message", {}),
}
EVENT_RESPONSE: Schema = {"event": (1, "message", PROCESS_EVENT)}  # StartResponse and ConnectResponse
PROCESS_INPUT: Schema = {"stdin": (1, "bytes", None), "pty": (2, "bytes", None)}
SEND_INPUT_REQUEST: Schema = {"process": (1, "message", SELECTOR), "input": (2, "message", PROCESS_INPUT)}
CLOSE_STDIN_REQUEST: Schema = {"process": (1, "message", SELECTOR)}
UPDATE_REQUEST: Schema = {"process": (1, "message", SELECTOR), "pty": (2, "message", PTY)}
