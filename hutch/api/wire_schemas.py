"""JSON Schemas of the wire bodies: what the main routes take (as api/parse.py and the route
handlers parse them) and what their success answers carry under ``data`` (as api/render.py's
renderers write them). /openapi.json (api/openapi.py) states them per route from ``ROUTES``.

One source of truth, held by tests/api/test_wire_schemas.py: each request schema's example is
accepted by the server and each of its required fields is refused when left out; each
renderer's fully populated output fits its schema and names no field the schema leaves out.
Objects stay open (no ``additionalProperties: false``): the parsers ignore fields they do not
know, and answers gain fields over time.
"""

from __future__ import annotations

from typing import Any

from hutch.api.parse import MAX_FILES
from hutch.core import egress, ids, snapshots
from hutch.core.models import ExecutionStatus, Mode, SandboxStatus, SnapshotStatus
from hutch.core.packages import APT_RE, MAX_ITEMS, NPM_RE
from hutch.service.fork import MAX_COPIES

Schema = dict[str, Any]

# --------------------------------------------------------------- building blocks

STRING: Schema = {"type": "string"}
NO_NUL: Schema = {"type": "string", "pattern": "^[^\\x00]*$"}
INTEGER: Schema = {"type": "integer"}
BOOLEAN: Schema = {"type": "boolean"}
OBJECT: Schema = {"type": "object"}
ENV_NAME = "^[A-Za-z_][A-Za-z0-9_]*$"  # parse.parse_env: letters, digits and _, no leading digit
BASE64 = "^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"  # b64decode(validate=True)
# core/quantities.py's forms (it also strips surrounding blanks).
DURATION: Schema = {"type": "string", "pattern": "^(?:[0-9]+(?:\\.[0-9]+)?(?:ms|s|m|h|d))+$",
                    "description": "a duration such as 30s, 5m, 1h or 1h30m (at most 36500d)"}
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


def nullable_optionals(schema: Schema) -> Schema:
    """A request schema as the parsers read it: an optional field sent as null is the field left
    out (``body.get(key)`` is None either way), so the document allows null there; the fuzzing's
    negative data (tests/api/test_openapi_fuzz.py) would otherwise call each such null a request
    the server wrongly accepts. Required fields stay as they are."""
    out = dict(schema)
    if "properties" in schema:
        required = set(schema.get("required", ()))
        out["properties"] = {k: v if k in required else _or_null(nullable_optionals(v))
                             for k, v in schema["properties"].items()}
    if isinstance(schema.get("items"), dict):
        out["items"] = nullable_optionals(schema["items"])
    return out


def _or_null(schema: Schema) -> Schema:
    if schema.get("type") == "null" or any(s.get("type") == "null" for s in schema.get("anyOf", ())):
        return schema
    return {"anyOf": [schema, {"type": "null"}]}


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

NETWORK_ALLOW = array({"type": "string", "pattern": "\\S"}, minItems=1, maxItems=egress.MAX_ENTRIES,
                      description="host names, IPv4 addresses or CIDRs (needs enabled): only these are reached")
NETWORK_DENY = array({"type": "string", "pattern": "\\S"}, minItems=1, maxItems=egress.MAX_ENTRIES,
                     description="IPv4 addresses or CIDRs (needs enabled; not with allow): these are not reached")
# PUT /sandbox/{id}/network: a live sandbox's egress rules, replaced whole (its port stays).
SET_NETWORK = obj({"enabled": BOOLEAN, "allow": NETWORK_ALLOW, "deny": NETWORK_DENY}, ("enabled",))
CREATE_SANDBOX = obj({
    "runtime": {"type": "string", "description": "a runtime name such as base:latest or python:3.13"},
    "runtimeId": {"type": "string", "description": "a runtime id (srt_...)"},
    "snapshot": {"type": "string", "pattern": "\\S",
                 "description": "a snapshot id (snp_...), name:tag or tag; not with runtime/runtimeId"},
    "name": STRING, "description": STRING, "projectId": STRING,
    "resources": obj({"memory": {**SIZE, "description": "at least 16Mi"}, "cpu": CPU,
                      "disk": {**SIZE, "description": "at least 16Mi"}}),
    "network": obj({"enabled": BOOLEAN, "port": {"type": "integer", "minimum": 1024, "maximum": 65535},
                    "allow": NETWORK_ALLOW, "deny": NETWORK_DENY}),
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
TAG_SNAPSHOT = obj({"tag": {"anyOf": [SNAPSHOT_TAG, {"type": "null"}, {"const": ""}],
                            "description": "the new tag, or null (or \"\") to remove it"}},
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
    "SetNetwork": {"enabled": False},
    "WriteFiles": {"files": [{"path": "notes/a.txt", "content": HELLO}]},
    "MakeDirectory": {"path": "work", "recursive": True},
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
    "networkEnabled": BOOLEAN, "networkPort": INTEGER, "networkAllow": array(STRING),
    "networkDeny": array(STRING), "url": URL, "org": ORG,
    "projectId": STRING, "timeout": obj({"idle": STRING, "execution": STRING, "paused": STRING}),
    "command": obj({"exec": array(STRING), "mode": enum_of(Mode), "omittedBytes": INTEGER, "sha256": STRING},
                   ("exec",)),
    "snapshot": obj({"id": STRING, "public": BOOLEAN, "user": OBJECT}, ("id",)),
    "dependencies": array(STRING), "packages": array(STRING), "reason": STRING, "cpuTimeMs": INTEGER,
    "memoryByteSec": INTEGER, "memoryPeakBytes": INTEGER,
    "node": {**STRING, "description": "the node it runs on (the node driver); the server administrator's keys only"},
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
    "commandOmittedBytes": INTEGER, "commandSha256": STRING,
}, ("executionId", "sandboxId", "type", "status", "command", "outputTruncated"))
EXECUTION_STARTED = obj({"executionId": id_of("execution"), "status": enum_of(ExecutionStatus),
                         "stdoutStreamUrl": URL, "stderrStreamUrl": URL}, ("executionId", "status"))
EXECUTION_LIST = obj({"executions": array(EXECUTION)}, ("executions",))
JOB_INFO = obj({
    "jobId": STRING, "sandboxId": id_of("sandbox"), "command": array(STRING),
    "status": {"type": "string", "enum": ["pending", "running", "completed", "failed", "cancelled"]},
    "exitCode": INTEGER, "startedAt": TIME, "completedAt": TIME, "error": STRING,
    "stdoutStreamUrl": URL, "stderrStreamUrl": URL, "commandOmittedBytes": INTEGER, "commandSha256": STRING,
}, ("jobId", "sandboxId", "command", "status", "stdoutStreamUrl", "stderrStreamUrl"))
JOB_LIST = obj({"jobs": array(JOB_INFO)}, ("jobs",))
SNAPSHOT = obj({
    "snapshotId": id_of("snapshot"), "runtimeId": STRING, "runtime": STRING, "name": STRING, "fullName": STRING,
    "description": STRING, "message": STRING, "tag": STRING, "sizeBytes": INTEGER, "fileCount": INTEGER,
    "parentSnapshotId": STRING, "sourceSandboxId": STRING, "status": enum_of(SnapshotStatus), "public": BOOLEAN,
    "createdAt": TIME, "projectId": STRING,
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

# --------------------------------------------------------------- the other routes

ISO_TIME: Schema = {"type": "string", "format": "date-time", "description": "an ISO 8601 time"}
EMPTY = obj({}, description="no fields read")
FORK = obj({"count": {"type": "integer", "minimum": 1, "maximum": MAX_COPIES}})
# Open, as the Agentuity wire's routes are (api/body_fields.py): a later client's own fields are
# taken; a look-alike of ``memory`` is refused.
PAUSE = obj({"memory": {**BOOLEAN, "description": "false: filesystem-only, every process ended, the files kept; "
                                                  "the resume boots it again (default true: frozen, memory kept)"}})
BUILD_SNAPSHOT = obj({"runtime": {"type": "string", "minLength": 1, "description": "a runtime name or id (srt_...)"},
                      "name": SNAPSHOT_NAME, "tag": SNAPSHOT_TAG, "description": STRING, "message": STRING,
                      "contentHash": STRING, "force": BOOLEAN, "public": BOOLEAN, "encrypt": BOOLEAN,
                      "projectId": STRING}, ("runtime",))
STRING_MAP: Schema = {"type": "object", "additionalProperties": STRING}
FINALIZE_SNAPSHOT = obj({"env": STRING_MAP, "metadata": STRING_MAP,
                         "dependencies": names(APT_RE.pattern, "apt packages"),
                         "packages": names(NPM_RE.pattern, "npm packages")})
LABEL: Schema = {"type": "string", "minLength": 1, "maxLength": 100}
CREATE_ORG = obj({"name": LABEL}, ("name",))
CREATE_PROJECT = obj({"name": LABEL}, ("name",))
ROLE: Schema = {"type": "string", "enum": ["admin", "member", "read-only"]}
POSITIVE: Schema = {"type": "number", "exclusiveMinimum": 0}
CREATE_KEY = obj({"role": ROLE, "name": LABEL, "projects": array(STRING), "expires": ISO_TIME,
                  "rate": POSITIVE, "burst": POSITIVE}, ("role",))
QUOTA_VALUE: Schema = {"anyOf": [{"type": "integer", "minimum": 0}, {"type": "null"}],
                       "description": "a limit, or null to lift it"}
SET_QUOTA = obj({k: QUOTA_VALUE for k in ("sandboxes", "memoryBytes", "cpuMillis", "snapshotBytes")},
                additionalProperties=False)
ADD_SSH_KEY = obj({"publicKey": {"type": "string", "minLength": 1, "description": "an OpenSSH public key line"},
                   "name": {"type": "string", "minLength": 1, "maxLength": 200}}, ("publicKey",))
CLI_CREATE_KEY = obj({"name": LABEL, "role": ROLE, "projectId": STRING, "expiresAt": ISO_TIME})
VALIDATE_APT = obj({"packages": array(STRING)}, ("packages",))
SIGN_IN = obj({"apiKey": {"type": "string", "pattern": "\\S"}}, ("apiKey",))
CREATE_STREAM = obj({"name": STRING})
DRAIN_NODE = obj({"undo": {**BOOLEAN, "description": "place new sandboxes on it again"},
                  "move": {**BOOLEAN, "description": "move its idle sandboxes to other nodes (files and env; "
                                                     "processes do not follow)"}},
                 additionalProperties=False)

EXAMPLES.update({
    "Empty": {}, "Fork": {"count": 2}, "Pause": {"memory": True}, "BuildSnapshot": {"runtime": "base:latest", "name": "built", "tag": "v1"},
    "FinalizeSnapshot": {"env": {"A": "1"}, "metadata": {"team": "a"}},
    "CreateOrg": {"name": "acme"}, "CreateProject": {"name": "web"},
    "CreateKey": {"role": "member", "name": "ci"}, "SetQuota": {"sandboxes": 10, "memoryBytes": None},
    "AddSshKey": {"publicKey": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFSuF78kEPZQhPLN8fhK4I8wC9CPASx+IY/dRyxdp1NX demo",
                  "name": "laptop"},
    "CliCreateKey": {"name": "cli", "role": "member"}, "ValidateApt": {"packages": ["curl", "no such"]},
    "SignIn": {"apiKey": "test-key"}, "CreateStream": {"name": "stdin"}, "DrainNode": {"undo": False},
})

COUNTS = {"type": "object", "additionalProperties": {"type": "number"}}
RUNTIME = obj({"id": STRING, "name": STRING, "description": STRING, "iconUrl": STRING, "brandColor": STRING,
               "url": STRING, "tags": array(STRING), "readme": STRING, "available": BOOLEAN, "building": BOOLEAN,
               "requirements": obj({"memory": STRING, "cpu": STRING, "disk": STRING, "networkEnabled": BOOLEAN}),
               "sizeBytes": INTEGER, "builtAt": STRING, "buildSeconds": {"type": "number"}},
              ("id", "name", "available"))
RUNTIME_LIST = obj({"runtimes": array(RUNTIME), "total": INTEGER}, ("runtimes", "total"))
USAGE = obj({"start": {"type": ["string", "null"]}, "end": {"type": ["string", "null"]},
             "sandboxes": obj({"created": INTEGER, "byStatus": COUNTS, "byRuntime": COUNTS}),
             "cpu": obj({"seconds": {"type": "number"}, "byStatus": COUNTS}),
             "memory": obj({"gibSeconds": {"type": "number"}, "byStatus": COUNTS}),
             "executions": obj({"total": INTEGER, "byStatus": COUNTS, "wallTimeMs": INTEGER}),
             "jobs": obj({"total": INTEGER, "byStatus": COUNTS, "wallTimeMs": INTEGER})},
            ("sandboxes", "cpu", "memory", "executions", "jobs"))
EVENT = obj({"eventId": STRING, "sandboxId": STRING, "type": STRING, "event": OBJECT, "createdAt": TIME,
             "position": INTEGER}, ("eventId", "type", "event", "createdAt", "position"))
EVENT_LIST = obj({"events": array(EVENT)}, ("events",))
HISTORY = obj({"history": array(obj({**EVENT["properties"], "status": enum_of(SandboxStatus),
                                     "executions": INTEGER}, ("eventId", "type", "status")))}, ("history",))
FORKED = obj({"snapshotId": id_of("snapshot"), "sandboxes": array(SANDBOX)}, ("snapshotId", "sandboxes"))
PAUSED = obj({"sandboxId": id_of("sandbox"), "status": enum_of(SandboxStatus), "terminatesAt": TIME,
              "memory": {**BOOLEAN, "description": "false where it paused filesystem-only (left out otherwise)"}},
             ("sandboxId", "status"))
SNAPSHOT_BUILD = obj({"snapshotId": id_of("snapshot"), "uploadUrl": URL, "encrypted": BOOLEAN,
                      "unchanged": BOOLEAN, "existingId": STRING, "existingName": STRING,
                      "existingTag": {"type": ["string", "null"]}})
UPLOADED = obj({"success": BOOLEAN, "scanned": BOOLEAN, "message": STRING}, ("success",))
LINEAGE = obj({"lineage": array(obj({**{k: SNAPSHOT["properties"][k] for k in (
    "snapshotId", "name", "fullName", "message", "tag", "parentSnapshotId", "public", "org", "user", "createdAt")},
    "deleted": BOOLEAN}, ("snapshotId", "deleted"))), "total": INTEGER}, ("lineage", "total"))
FILE_LIST = obj({"files": array(obj({"path": STRING, "size": INTEGER, "isDir": BOOLEAN, "isSymlink": BOOLEAN,
                                     "linkTarget": STRING, "mode": STRING, "modTime": TIME},
                                    ("path", "size", "isDir", "mode", "modTime")))}, ("files",))
UNPACKED = obj({"files": INTEGER, "directories": INTEGER, "symlinks": INTEGER, "bytes": INTEGER},
               ("files", "directories", "symlinks", "bytes"))
AUTO_RESUMED = obj({"autoResumed": BOOLEAN}, ("autoResumed",))
FOUND = obj({"found": BOOLEAN}, ("found",))
STREAM_CREATED = obj({"id": STRING}, ("id",))
BYTES_TAKEN = obj({"bytes": INTEGER}, ("bytes",))
NULLABLE_INT: Schema = {"type": ["integer", "null"]}
QUOTA = obj({k: NULLABLE_INT for k in ("sandboxes", "memoryBytes", "cpuMillis", "snapshotBytes")})
# snapshotBytes of the quota bounds storageBytes of the usage (snapshots, checkpoints, uploads, output,
# event log records).
ORG_USAGE = obj({k: INTEGER for k in ("sandboxes", "memoryBytes", "cpuMillis", "snapshotBytes", "checkpointBytes",
                                      "uploadBytes", "outputBytes", "eventBytes",
                                      "storageBytes")})
ORG_INFO = obj({"id": STRING, "name": STRING, "createdAt": TIME, "quota": QUOTA, "usage": ORG_USAGE},
               ("id", "name", "createdAt", "quota"))
ORG_LIST = obj({"orgs": array(ORG_INFO), "total": INTEGER}, ("orgs", "total"))
NODE = obj({"name": STRING, "state": {"type": "string", "enum": ["up", "unreachable", "lost"]},
            "draining": BOOLEAN, "sandboxes": INTEGER, "cpus": INTEGER, "memoryTotal": INTEGER,
            "memoryAvailable": INTEGER, "memoryCommitted": INTEGER, "cpuCommittedMillis": INTEGER,
            "reason": STRING}, ("name", "state", "draining", "sandboxes"))
NODE_LIST = obj({"nodes": array(NODE), "total": INTEGER}, ("nodes", "total"))
NODE_DRAINED = obj({
    "node": NODE,
    "moved": array(obj({"sandboxId": id_of("sandbox"), "fromNode": STRING, "toNode": STRING},
                       ("sandboxId", "fromNode", "toNode"))),
    "left": array(obj({"sandboxId": id_of("sandbox"), "reason": STRING}, ("sandboxId", "reason"))),
    "note": {**STRING, "description": "what a move does not carry: the sandboxes' processes"},
}, ("node",))
PROJECT = obj({"id": STRING, "name": STRING, "orgId": STRING, "createdAt": TIME}, ("id", "name", "orgId"))
PROJECT_LIST = obj({"projects": array(PROJECT), "total": INTEGER}, ("projects", "total"))
NULLABLE_STRING: Schema = {"type": ["string", "null"]}
KEY = obj({"id": STRING, "name": NULLABLE_STRING, "orgId": STRING, "role": ROLE, "prefix": STRING,
           "projects": array(STRING), "createdAt": TIME, "expiresAt": NULLABLE_STRING, "revokedAt": NULLABLE_STRING,
           "rate": {"type": ["number", "null"]}, "burst": {"type": ["number", "null"]},
           "secret": {"type": "string", "description": "only in the answer to its creation"}},
          ("id", "orgId", "role", "prefix", "projects", "createdAt"))
KEY_LIST = obj({"keys": array(KEY), "total": INTEGER}, ("keys", "total"))
SSH_KEY = obj({"id": STRING, "orgId": STRING, "name": STRING, "publicKey": STRING, "fingerprint": STRING,
               "createdAt": TIME, "addedBy": NULLABLE_STRING, "projects": array(STRING)},
              ("id", "orgId", "name", "publicKey", "fingerprint"))
SSH_KEY_LIST = obj({"sshKeys": array(SSH_KEY)}, ("sshKeys",))
HEALTH = obj({"status": {"const": "ok"}, "ssh": obj({"port": INTEGER})}, ("status",))
ME = obj({"keyId": NULLABLE_STRING, "orgId": STRING, "role": ROLE, "projects": array(STRING),
          "serverAdmin": BOOLEAN, "csrf": STRING}, ("orgId", "role", "projects", "serverAdmin"))
SIGNED_OUT = obj({"signedOut": {"const": True}}, ("signedOut",))
CLI_ORGS = array(obj({"id": STRING, "name": STRING}, ("id", "name")))
CLI_USER = obj({"firstName": STRING, "lastName": STRING, "organizations": CLI_ORGS},
               ("firstName", "lastName", "organizations"))
CLI_REGIONS = array(obj({"region": STRING, "description": STRING}, ("region",)))
CLI_SANDBOX = obj({"id": STRING, "name": NULLABLE_STRING, "description": NULLABLE_STRING, "status": STRING,
                   "region": STRING, "createdAt": TIME, "orgId": STRING, "orgName": STRING,
                   "projectId": NULLABLE_STRING}, ("id", "status", "region", "orgId"))
CLI_SANDBOX_LIST = obj({"sandboxes": array(CLI_SANDBOX), "total": INTEGER}, ("sandboxes", "total"))
CLI_PROJECT = obj({"id": STRING, "name": STRING, "orgId": STRING, "region": STRING, "description": NULLABLE_STRING,
                   "tags": array(STRING), "secrets": OBJECT, "env": OBJECT, "deployment": {}},
                  ("id", "name", "orgId", "region"))
CLI_APT = obj({"valid": array(STRING), "invalid": array(obj({"package": STRING, "error": STRING,
                                                             "searchUrl": STRING}, ("package", "error")))},
              ("valid", "invalid"))
CLI_KEY_CREATED = obj({"id": STRING, "value": STRING}, ("id", "value"))
CLI_KEY = obj({"id": STRING, "name": NULLABLE_STRING, "orgId": STRING, "type": STRING,
               "expiresAt": NULLABLE_STRING, "lastUsedAt": {"type": "null"}, "createdAt": NULLABLE_STRING,
               "project": {"anyOf": [obj({"id": STRING, "name": STRING}), {"type": "null"}]}},
              ("id", "orgId", "type"))
CLI_KEY_LIST = array(CLI_KEY)
ROWS = {"type": "integer", "description": "rows affected"}
SERVICE_STATS = obj({"services": obj({"sandbox": obj({k: INTEGER for k in (
    "totalActive", "running", "idle", "creating", "totalExecutions", "totalCpuTimeMs", "totalMemoryByteSec",
    "totalNetworkEgressBytes")})}, ("sandbox",))}, ("services",))

# Named as /openapi.json's components/schemas name them.
_SCHEMAS: dict[str, Schema] = {
    "CreateSandbox": CREATE_SANDBOX, "Execute": EXECUTE, "StartJob": JOB, "SetEnv": SET_ENV, "SetNetwork": SET_NETWORK,
    "WriteFiles": WRITE_FILES, "MakeDirectory": MKDIR, "RemoveFile": REMOVE_FILE, "RemoveDirectory": REMOVE_DIR,
    "TakeSnapshot": TAKE_SNAPSHOT, "TagSnapshot": TAG_SNAPSHOT, "CreateCheckpoint": CREATE_CHECKPOINT,
    "Sandbox": SANDBOX, "SandboxCreated": SANDBOX_CREATED, "SandboxList": SANDBOX_LIST,
    "SandboxStatus": SANDBOX_STATUS, "Execution": EXECUTION, "ExecutionStarted": EXECUTION_STARTED,
    "ExecutionList": EXECUTION_LIST, "Job": JOB_INFO, "JobList": JOB_LIST, "Snapshot": SNAPSHOT,
    "SnapshotList": SNAPSHOT_LIST,
    "Checkpoint": CHECKPOINT, "CheckpointList": CHECKPOINT_LIST, "EnvSet": ENV_SET, "FilesWritten": FILES_WRITTEN,
    "Empty": EMPTY, "Fork": FORK, "Pause": PAUSE, "BuildSnapshot": BUILD_SNAPSHOT, "FinalizeSnapshot": FINALIZE_SNAPSHOT,
    "CreateOrg": CREATE_ORG, "CreateProject": CREATE_PROJECT, "CreateKey": CREATE_KEY, "SetQuota": SET_QUOTA,
    "AddSshKey": ADD_SSH_KEY, "CliCreateKey": CLI_CREATE_KEY, "ValidateApt": VALIDATE_APT, "SignIn": SIGN_IN,
    "CreateStream": CREATE_STREAM, "DrainNode": DRAIN_NODE, "Node": NODE, "NodeList": NODE_LIST,
    "NodeDrained": NODE_DRAINED,
    "RuntimeList": RUNTIME_LIST, "Usage": USAGE, "EventList": EVENT_LIST, "History": HISTORY, "Forked": FORKED,
    "Paused": PAUSED, "SnapshotBuild": SNAPSHOT_BUILD, "Uploaded": UPLOADED, "Lineage": LINEAGE,
    "FileList": FILE_LIST, "Unpacked": UNPACKED, "Found": FOUND, "AutoResumed": AUTO_RESUMED, "StreamCreated": STREAM_CREATED,
    "BytesTaken": BYTES_TAKEN, "Org": ORG_INFO, "OrgList": ORG_LIST, "Project": PROJECT,
    "ProjectList": PROJECT_LIST, "Key": KEY, "KeyList": KEY_LIST, "SshKey": SSH_KEY, "SshKeyList": SSH_KEY_LIST,
    "Health": HEALTH, "Me": ME, "SignedOut": SIGNED_OUT, "CliOrgs": CLI_ORGS, "CliUser": CLI_USER,
    "CliRegions": CLI_REGIONS, "CliSandboxList": CLI_SANDBOX_LIST, "CliSandbox": CLI_SANDBOX,
    "CliProject": CLI_PROJECT, "CliApt": CLI_APT, "CliKeyCreated": CLI_KEY_CREATED, "CliKey": CLI_KEY,
    "CliKeyList": CLI_KEY_LIST, "Rows": ROWS, "ServiceStats": SERVICE_STATS,
}
SCHEMAS: dict[str, Schema] = {name: nullable_optionals(schema) if name in EXAMPLES else schema
                              for name, schema in _SCHEMAS.items()}

__all__ = ["EXAMPLES", "SCHEMAS", "Schema"]
