"""JSON Schemas of the wire bodies: what the main routes take (as api/wire.py and the route
handlers parse them) and what their success answers carry under ``data`` (as api/wire.py's
renderers write them). /openapi.json (api/openapi.py) states them per route from ``ROUTES``.

One source of truth, held by tests/api/test_wire_schemas.py: each request schema's example is
accepted by the server and each of its required fields is refused when left out; each
renderer's fully populated output fits its schema and names no field the schema leaves out.
Objects stay open (no ``additionalProperties: false``): the parsers ignore fields they do not
know, and answers gain fields over time.
"""

from __future__ import annotations

from typing import Any

import attrs

from hutch.api.wire import MAX_FILES
from hutch.core import egress, ids, snapshots
from hutch.core.models import ExecutionStatus, Mode, SandboxStatus, SnapshotStatus
from hutch.core.packages import APT_RE, MAX_ITEMS, NPM_RE

Schema = dict[str, Any]

# --------------------------------------------------------------- building blocks

STRING: Schema = {"type": "string"}
NO_NUL: Schema = {"type": "string", "pattern": "^[^\\x00]*$"}
INTEGER: Schema = {"type": "integer"}
BOOLEAN: Schema = {"type": "boolean"}
OBJECT: Schema = {"type": "object"}
ENV_NAME = "^[A-Za-z_][A-Za-z0-9_]*$"  # wire.parse_env: letters, digits and _, no leading digit
BASE64 = "^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"  # b64decode(validate=True)
# core/quantities.py's forms (it also strips surrounding blanks).
DURATION: Schema = {"type": "string", "pattern": "^(?:[0-9]+(?:\\.[0-9]+)?(?:ms|s|m|h|d))+$",
                    "description": "a duration such as 30s, 5m, 1h or 1h30m"}
SIZE: Schema = {"anyOf": [{"type": "string", "pattern": "^[0-9]+(?:\\.[0-9]+)?(?:[kmgtKMGT]i?|[bB])?$"},
                          {"type": "integer", "minimum": 1}],
                "description": "bytes, or a size such as 512Mi, 1Gi or 512M"}
CPU: Schema = {"anyOf": [{"type": "string", "pattern": "^[0-9]+(?:\\.[0-9]+)?m?$"},
                         {"type": "number", "exclusiveMinimum": 0}],
               "description": "cores, or millicores such as 500m"}


def id_of(kind: str) -> Schema:
    """An id as core/ids.py makes them: its kind's prefix and 26 base32 characters."""
    return {"type": "string", "pattern": f"^{ids.PREFIXES[kind]}_[0-9a-hjkmnp-tv-z]{{26}}$"}


def enum_of(values: Any) -> Schema:
    return {"type": "string", "enum": [v.value for v in values]}


def obj(properties: dict[str, Schema], required: tuple[str, ...] = (), **extra: Any) -> Schema:
    out: Schema = {"type": "object", "properties": properties, **extra}
    if required:
        out["required"] = list(required)
    return out


def array(items: Schema, **extra: Any) -> Schema:
    return {"type": "array", "items": items, **extra}


def names(pattern: str, what: str) -> Schema:
    """core/packages.py's lists: at most MAX_ITEMS names, each fully matching its pattern."""
    return array({"type": "string", "pattern": f"^(?:{pattern})$"}, maxItems=MAX_ITEMS, description=what)


COMMAND = array(NO_NUL, minItems=1, description="the program and its arguments")
ENV = {"type": "object", "propertyNames": {"pattern": ENV_NAME}, "additionalProperties": NO_NUL}
FILES = array(obj({"path": {**NO_NUL, "minLength": 1, "pattern": "^[^\\x00]*[^\\s\\x00][^\\x00]*$"},
                   "content": {"type": "string", "contentEncoding": "base64", "pattern": BASE64}},
                  ("path", "content")),
              maxItems=MAX_FILES, description="files written before the command runs")
STREAM = obj({"stdout": {"const": "ignore"}, "stderr": {"const": "ignore"},
              "stdin": {"type": "string", "description": '"ignore" or a stdin stream id (POST /streams)'},
              "timestamps": BOOLEAN})
FS_PATH: Schema = {**NO_NUL, "minLength": 1, "maxLength": 4096}

# --------------------------------------------------------------- request bodies

CREATE_SANDBOX = obj({
    "runtime": {"type": "string", "description": "a runtime name such as base:latest or python:3.13"},
    "runtimeId": {"type": "string", "description": "a runtime id (srt_...)"},
    "snapshot": {"type": "string", "pattern": "\\S",
                 "description": "a snapshot id (snp_...), name:tag or tag; not with runtime/runtimeId"},
    "name": STRING, "description": STRING, "projectId": STRING,
    "resources": obj({"memory": {**SIZE, "description": "at least 16Mi"}, "cpu": CPU,
                      "disk": {**SIZE, "description": "at least 16Mi"}}),
    "network": obj({"enabled": BOOLEAN, "port": {"type": "integer", "minimum": 1024, "maximum": 65535},
                    "allow": array({"type": "string", "pattern": "\\S"}, minItems=1, maxItems=egress.MAX_ENTRIES,
                                   description="host names, IPv4 addresses or CIDRs (needs enabled)")}),
    "timeout": obj({"idle": DURATION, "execution": DURATION, "paused": DURATION}),
    "command": obj({"exec": COMMAND, "mode": enum_of(Mode), "files": FILES}, ("exec",),
                   description="the initial command; a oneshot sandbox ends with it"),
    "env": ENV,
    "metadata": OBJECT,
    "files": FILES,
    "dependencies": names(APT_RE.pattern, "apt packages such as curl or jq=1.7.1-3"),
    "packages": names(NPM_RE.pattern, "npm packages such as typescript or zod@3"),
    "stream": STREAM,
})
EXECUTE = obj({"command": COMMAND, "files": FILES, "stream": STREAM,
               "timeout": {"anyOf": [DURATION, {"type": "number", "minimum": 0}],
                           "description": "seconds, or a duration such as 30s"}}, ("command",))
JOB = obj({"command": COMMAND}, ("command",))
SET_ENV = obj({"env": {"type": "object", "propertyNames": {"pattern": ENV_NAME},
                       "additionalProperties": {"anyOf": [NO_NUL, {"type": "null"}]},
                       "description": "a string sets a variable, null removes it"}}, ("env",))
WRITE_FILES = obj({"files": FILES})
MKDIR = obj({"path": FS_PATH, "recursive": BOOLEAN}, ("path",))
REMOVE_FILE = obj({"path": FS_PATH}, ("path",))
REMOVE_DIR = obj({"path": FS_PATH, "recursive": BOOLEAN}, ("path",))
SNAPSHOT_NAME: Schema = {"type": "string", "pattern": snapshots.NAME_RE.pattern}
SNAPSHOT_TAG: Schema = {"type": "string", "pattern": snapshots.TAG_RE.pattern}
TAKE_SNAPSHOT = obj({"name": SNAPSHOT_NAME, "description": STRING, "tag": SNAPSHOT_TAG, "public": BOOLEAN})
TAG_SNAPSHOT = obj({"tag": {"anyOf": [SNAPSHOT_TAG, {"type": "null"}], "description": "the new tag, or null to remove it"}},
                   ("tag",))
CREATE_CHECKPOINT = obj({"name": {"type": "string", "minLength": 1, "maxLength": 200, "pattern": "\\S"}}, ("name",))

# A valid body of each: /openapi.json's examples (Schemathesis' "examples" phase sends them),
# and what tests/api/test_wire_schemas.py sends the server to see them accepted.
HELLO = "aGVsbG8K"  # base64 of "hello\n"
EXAMPLES: dict[str, Schema] = {
    "CreateSandbox": {"runtime": "base:latest", "name": "demo", "resources": {"memory": "512Mi", "cpu": "500m"},
                      "timeout": {"idle": "10m"}, "env": {"GREETING": "hi"}, "metadata": {"team": "a"},
                      "command": {"exec": ["cat", "hello.txt"], "mode": "interactive"},
                      "files": [{"path": "hello.txt", "content": HELLO}], "stream": {"timestamps": False}},
    "Execute": {"command": ["echo", "hi"], "timeout": "30s", "files": [{"path": "in.txt", "content": HELLO}]},
    "StartJob": {"command": ["sleep", "1"]},
    "SetEnv": {"env": {"GREETING": "hello", "OLD": None}},
    "WriteFiles": {"files": [{"path": "notes/a.txt", "content": HELLO}]},
    "MakeDirectory": {"path": "work/out", "recursive": True},
    "RemoveFile": {"path": "notes/a.txt"},
    "RemoveDirectory": {"path": "work", "recursive": True},
    "TakeSnapshot": {"name": "demo", "tag": "v1", "description": "a demo"},
    "TagSnapshot": {"tag": "v2"},
    "CreateCheckpoint": {"name": "before-upgrade"},
}

# --------------------------------------------------------------- success answers (data)

URL: Schema = {"type": "string"}
TIME: Schema = {"type": "string", "description": "an ISO 8601 time"}
ORG = obj({"id": STRING, "name": STRING}, ("id", "name"))
RUNTIME_SUMMARY = obj({"id": STRING, "name": STRING, "iconUrl": STRING, "brandColor": STRING, "tags": array(STRING)},
                      ("id", "name"))
SANDBOX = obj({
    "sandboxId": id_of("sandbox"), "identifier": STRING, "name": STRING, "description": STRING,
    "status": enum_of(SandboxStatus), "mode": enum_of(Mode), "createdAt": TIME, "updatedAt": TIME,
    "region": STRING, "runtime": RUNTIME_SUMMARY, "executions": INTEGER, "exitCode": INTEGER,
    "stdoutStreamUrl": URL, "stderrStreamUrl": URL, "metadata": {}, "resources": obj({
        "memory": STRING, "cpu": STRING, "disk": STRING}),
    "networkEnabled": BOOLEAN, "networkPort": INTEGER, "networkAllow": array(STRING), "url": URL, "org": ORG,
    "projectId": STRING, "timeout": obj({"idle": STRING, "execution": STRING, "paused": STRING}),
    "command": obj({"exec": array(STRING), "mode": enum_of(Mode)}, ("exec",)),
    "snapshot": obj({"id": STRING, "public": BOOLEAN, "user": OBJECT}, ("id",)),
    "dependencies": array(STRING), "packages": array(STRING), "reason": STRING, "cpuTimeMs": INTEGER,
    "memoryByteSec": INTEGER, "memoryPeakBytes": INTEGER,
}, ("sandboxId", "identifier", "status", "mode", "createdAt", "updatedAt", "region", "runtime", "executions",
    "resources", "networkEnabled", "org", "timeout"))
SANDBOX_CREATED = obj({
    "sandboxId": id_of("sandbox"), "status": enum_of(SandboxStatus), "auditStreamId": STRING,
    "auditStreamUrl": URL, "url": URL, "executionId": id_of("execution"),
    "stdoutStreamId": STRING, "stdoutStreamUrl": URL, "stderrStreamId": STRING, "stderrStreamUrl": URL,
}, ("sandboxId", "status", "auditStreamId", "auditStreamUrl", "stdoutStreamId", "stdoutStreamUrl",
    "stderrStreamId", "stderrStreamUrl"))
SANDBOX_LIST = obj({"sandboxes": array(SANDBOX), "total": INTEGER}, ("sandboxes", "total"))
SANDBOX_STATUS = obj({"sandboxId": id_of("sandbox"), "status": enum_of(SandboxStatus), "exitCode": INTEGER},
                     ("sandboxId", "status"))
EXECUTION = obj({
    "executionId": STRING, "sandboxId": id_of("sandbox"), "type": STRING, "status": enum_of(ExecutionStatus),
    "command": array(STRING), "exitCode": INTEGER, "durationMs": INTEGER, "startedAt": TIME, "completedAt": TIME,
    "error": STRING, "stdoutStreamUrl": URL, "stderrStreamUrl": URL, "outputTruncated": BOOLEAN,
}, ("executionId", "sandboxId", "type", "status", "command", "outputTruncated"))
EXECUTION_STARTED = obj({"executionId": id_of("execution"), "status": enum_of(ExecutionStatus),
                         "stdoutStreamUrl": URL, "stderrStreamUrl": URL}, ("executionId", "status"))
EXECUTION_LIST = obj({"executions": array(EXECUTION)}, ("executions",))
JOB_INFO = obj({
    "jobId": STRING, "sandboxId": id_of("sandbox"), "command": array(STRING),
    "status": {"type": "string", "enum": ["pending", "running", "completed", "failed", "cancelled"]},
    "exitCode": INTEGER, "startedAt": TIME, "completedAt": TIME, "error": STRING,
    "stdoutStreamUrl": URL, "stderrStreamUrl": URL,
}, ("jobId", "sandboxId", "command", "status", "stdoutStreamUrl", "stderrStreamUrl"))
JOB_LIST = obj({"jobs": array(JOB_INFO)}, ("jobs",))
SNAPSHOT = obj({
    "snapshotId": id_of("snapshot"), "runtimeId": STRING, "runtime": STRING, "name": STRING, "fullName": STRING,
    "description": STRING, "message": STRING, "tag": STRING, "sizeBytes": INTEGER, "fileCount": INTEGER,
    "parentSnapshotId": STRING, "sourceSandboxId": STRING, "status": enum_of(SnapshotStatus), "public": BOOLEAN,
    "createdAt": TIME,
    "files": array(obj({"path": STRING, "size": INTEGER, "sha256": STRING, "contentType": STRING, "mode": INTEGER},
                       ("path", "size"))),
    "env": {"type": "object", "additionalProperties": STRING}, "dependencies": array(STRING),
    "packages": array(STRING), "userMetadata": OBJECT, "downloadUrl": URL,
    "org": obj({"id": STRING, "name": STRING, "slug": STRING}), "orgName": STRING, "orgSlug": STRING,
    "user": OBJECT,
}, ("snapshotId", "runtimeId", "runtime", "name", "fullName", "sizeBytes", "fileCount", "status", "public",
    "createdAt", "files"))
SNAPSHOT_LIST = obj({"snapshots": array(SNAPSHOT), "total": INTEGER}, ("snapshots", "total"))
CHECKPOINT = obj({"id": id_of("checkpoint"), "name": STRING, "createdAt": TIME, "parent": STRING},
                 ("id", "name", "createdAt", "parent"))
CHECKPOINT_LIST = obj({"checkpoints": array(CHECKPOINT)}, ("checkpoints",))
ENV_SET = obj({"env": {"type": "object", "additionalProperties": STRING}}, ("env",))
FILES_WRITTEN = obj({"filesWritten": INTEGER}, ("filesWritten",))

# Named as /openapi.json's components/schemas name them.
SCHEMAS: dict[str, Schema] = {
    "CreateSandbox": CREATE_SANDBOX, "Execute": EXECUTE, "StartJob": JOB, "SetEnv": SET_ENV,
    "WriteFiles": WRITE_FILES, "MakeDirectory": MKDIR, "RemoveFile": REMOVE_FILE, "RemoveDirectory": REMOVE_DIR,
    "TakeSnapshot": TAKE_SNAPSHOT, "TagSnapshot": TAG_SNAPSHOT, "CreateCheckpoint": CREATE_CHECKPOINT,
    "Sandbox": SANDBOX, "SandboxCreated": SANDBOX_CREATED, "SandboxList": SANDBOX_LIST,
    "SandboxStatus": SANDBOX_STATUS, "Execution": EXECUTION, "ExecutionStarted": EXECUTION_STARTED,
    "ExecutionList": EXECUTION_LIST, "Job": JOB_INFO, "JobList": JOB_LIST, "Snapshot": SNAPSHOT,
    "SnapshotList": SNAPSHOT_LIST,
    "Checkpoint": CHECKPOINT, "CheckpointList": CHECKPOINT_LIST, "EnvSet": ENV_SET, "FilesWritten": FILES_WRITTEN,
}


@attrs.frozen
class Bodies:
    """One route's schemas, by name in SCHEMAS: its request body and its success answer's data."""

    request: str | None = None
    data: str | None = None
    required: bool = True  # whether the route refuses an empty body


# (method, path template as the router has it) -> its bodies.
ROUTES: dict[tuple[str, str], Bodies] = {
    ("POST", "/sandbox"): Bodies("CreateSandbox", "SandboxCreated"),
    ("GET", "/sandbox"): Bodies(data="SandboxList"),
    ("GET", "/sandbox/{sandbox_id}"): Bodies(data="Sandbox"),
    ("GET", "/sandbox/status/{sandbox_id}"): Bodies(data="SandboxStatus"),
    ("POST", "/sandbox/{sandbox_id}/execute"): Bodies("Execute", "ExecutionStarted"),
    ("GET", "/sandbox/execution/{execution_id}"): Bodies(data="Execution"),
    ("POST", "/sandbox/execution/{execution_id}/cancel"): Bodies(data="Execution"),
    ("GET", "/sandbox/sandboxes/{sandbox_id}/executions"): Bodies(data="ExecutionList"),
    ("POST", "/sandbox/sandboxes/{sandbox_id}/jobs"): Bodies("StartJob", "Job"),
    ("GET", "/sandbox/sandboxes/{sandbox_id}/jobs"): Bodies(data="JobList"),
    ("GET", "/sandbox/sandboxes/{sandbox_id}/jobs/{job_id}"): Bodies(data="Job"),
    ("DELETE", "/sandbox/sandboxes/{sandbox_id}/jobs/{job_id}"): Bodies(data="Job"),
    ("PATCH", "/sandbox/env/{sandbox_id}"): Bodies("SetEnv", "EnvSet"),
    ("POST", "/fs/{sandbox_id}"): Bodies("WriteFiles", "FilesWritten"),
    ("POST", "/fs/mkdir/{sandbox_id}"): Bodies("MakeDirectory"),
    ("POST", "/fs/rm/{sandbox_id}"): Bodies("RemoveFile"),
    ("POST", "/fs/rmdir/{sandbox_id}"): Bodies("RemoveDirectory"),
    ("POST", "/sandbox/{sandbox_id}/snapshot"): Bodies("TakeSnapshot", "Snapshot", required=False),
    ("GET", "/sandbox/snapshots"): Bodies(data="SnapshotList"),
    ("GET", "/sandbox/snapshots/{snapshot_id}"): Bodies(data="Snapshot"),
    ("PATCH", "/sandbox/snapshots/{snapshot_id}"): Bodies("TagSnapshot", "Snapshot"),
    ("POST", "/sandbox/{sandbox_id}/checkpoint"): Bodies("CreateCheckpoint", "Checkpoint"),
    ("GET", "/sandbox/checkpoints/{sandbox_id}"): Bodies(data="CheckpointList"),
}

__all__ = ["EXAMPLES", "ROUTES", "SCHEMAS", "Bodies"]
