"""Every operation of the API, described: for each (method, path template) the router has, its
request body and success answer (schemas by name in api/wire_schemas.py's ``SCHEMAS``), its
media types and its query parameters with the limits the handlers enforce. /openapi.json
(api/openapi.py) is made from it; tests/api/test_wire_schemas.py fails if a route of the live
router is missing here, and calls every operation of a live server to hold answers to it.

``orgId`` is not listed per route: every route that needs a key takes it (the tenancy layer
reads it for all of them), so api/openapi.py adds it to each such operation.
"""

from __future__ import annotations

from typing import Any

import attrs

from hutch.api.http import MAX_OFFSET
from hutch.api.wire_schemas import DURATION, FS_PATH, STRING, Schema
from hutch.core.models import Mode, SandboxStatus
from hutch.projections.base import SNAPSHOT_SORTS
from hutch.service.archives import FORMATS
from hutch.service.snapshots import LINEAGE_MAX

JSON = "application/json"
NONE = ""  # a route that reads no body, or answers no data: said, not left undescribed


@attrs.frozen
class Param:
    name: str
    schema: Schema
    description: str = ""
    required: bool = False


@attrs.frozen
class Op:
    """One operation. ``request``/``data`` None: not described (the completeness test refuses
    it where the route takes or answers JSON); NONE: it takes no body / answers no data."""

    request: str | None = None  # its JSON body's schema
    data: str | None = None  # its success answer's ``data`` schema
    required: bool = True  # whether it refuses an empty body
    query: tuple[Param, ...] = ()
    media: str = JSON  # what a success answers
    takes: str | None = None  # a body that is not JSON: its media type
    top: str | None = None  # the schema of fields the answer has beside ``data`` (the client reads them there)


def _int(lo: int, hi: int | None = None, default: int | None = None) -> Schema:
    out: Schema = {"type": "integer", "minimum": lo}
    if hi is not None:
        out["maximum"] = hi
    if default is not None:
        out["default"] = default
    return out


# A query boolean: what the clients send (true/false) and what curl users type (1/0); api/http.py.
BOOLEAN: Schema = {"type": "boolean", "description": "true or false (1 or 0, yes or no, in any case, too)"}


def _one_of(values: Any) -> Schema:
    return {"type": "string", "enum": list(values)}


def limit(default: int, hi: int) -> Param:
    return Param("limit", _int(1, hi, default), "how many at most")


OFFSET = Param("offset", _int(0, MAX_OFFSET, 0), "how many to skip")
DIRECTION = Param("direction", _one_of(("asc", "desc")))
TIME_Q = {"type": "string", "description": "an ISO 8601 time such as 2026-04-01T00:00:00Z"}
WINDOW = (Param("start", TIME_Q, "sandboxes created from"), Param("end", TIME_Q, "sandboxes created before"))
STATUS = Param("status", _one_of(s.value for s in SandboxStatus))
MODE = Param("mode", _one_of(m.value for m in Mode))
PROJECT = Param("projectId", STRING, "a project id or name")
WAIT = (Param("waitForStatus", STRING, "statuses to wait for, comma-separated"),
        Param("waitMs", _int(0), "how long to wait for them"), Param("includeDeleted", BOOLEAN))
SANDBOX_SORTS = ("name", "created", "createdAt", "updated", "updatedAt", "status", "mode", "execution_count")
CLI_SORTS = ("created", "createdAt", "updated", "updatedAt", "name", "status", "mode")
PATH_Q = Param("path", FS_PATH, "a path in the sandbox")


def snapshot_query(hi: int) -> tuple[Param, ...]:
    return (Param("sandboxId", STRING), Param("name", STRING), Param("tag", STRING),
            Param("forks", BOOLEAN, "also the snapshots forks keep of their instant (hidden by default)"),
            limit(50, hi), OFFSET,
            Param("sort", _one_of(sorted(SNAPSHOT_SORTS))), DIRECTION)


_S, _X, _J, _SN = "/sandbox/{sandbox_id}", "/sandbox/execution/{execution_id}", "/sandbox/sandboxes/{sandbox_id}", \
    "/sandbox/snapshots"
ROUTES: dict[tuple[str, str], Op] = {
    # Sandboxes (what makes an id comes first: tests/api/test_wire_schemas.py calls them in order).
    ("POST", "/sandbox"): Op("CreateSandbox", "SandboxCreated"),
    ("GET", "/sandbox"): Op(data="SandboxList", query=(
        Param("name", STRING), MODE, PROJECT, Param("snapshotId", STRING), STATUS, Param("live", BOOLEAN),
        Param("deletedOnly", BOOLEAN), limit(50, 100), OFFSET, Param("sort", _one_of(SANDBOX_SORTS)), DIRECTION)),
    ("GET", _S): Op(data="Sandbox", query=(Param("asOf", STRING, "an event id or an ISO 8601 time"), *WAIT)),
    ("GET", "/sandbox/status/{sandbox_id}"): Op(data="SandboxStatus", query=WAIT),
    ("POST", _S + "/execute"): Op("Execute", "ExecutionStarted", top="AutoResumed"),
    ("GET", _X): Op(data="Execution", query=(Param("wait", DURATION, "wait this long for it to end"),)),
    ("GET", _J + "/executions"): Op(data="ExecutionList", query=(limit(50, 1000),)),
    ("GET", _J + "/events"): Op(data="EventList", query=(limit(50, 100), DIRECTION)),
    ("GET", _J + "/history"): Op(data="History"),
    ("POST", _J + "/jobs"): Op("StartJob", "Job"),
    ("GET", _J + "/jobs"): Op(data="JobList", query=(limit(50, 1000),)),
    ("GET", _J + "/jobs/{job_id}"): Op(data="Job"),
    ("PATCH", "/sandbox/env/{sandbox_id}"): Op("SetEnv", "EnvSet"),
    ("POST", "/fs/{sandbox_id}"): Op("WriteFiles", "FilesWritten", top="FilesWritten"),
    ("GET", "/fs/{sandbox_id}"): Op(query=(attrs.evolve(PATH_Q, required=True),), media="application/octet-stream"),
    ("GET", "/fs/list/{sandbox_id}"): Op(data="FileList", query=(PATH_Q,)),
    ("POST", "/fs/mkdir/{sandbox_id}"): Op("MakeDirectory", NONE),
    ("POST", "/fs/upload/{sandbox_id}"): Op(NONE, "Unpacked", takes="application/octet-stream", query=(
        Param("format", _one_of((*FORMATS, "tgz", "tar+gzip")), "the archive's format (else read from it)"),
        PATH_Q)),
    ("GET", "/fs/download/{sandbox_id}"): Op(query=(Param("format", _one_of(FORMATS)), PATH_Q),
                                             media="application/gzip"),  # or zip, x-tar: by format
    ("POST", "/fs/rm/{sandbox_id}"): Op("RemoveFile", NONE, top="Found"),
    ("POST", "/fs/rmdir/{sandbox_id}"): Op("RemoveDirectory", NONE, top="Found"),
    ("POST", _S + "/checkpoint"): Op("CreateCheckpoint", "Checkpoint"),
    ("GET", "/sandbox/checkpoints/{sandbox_id}"): Op(data="CheckpointList"),
    ("POST", _S + "/checkpoint/{checkpoint_id}/restore"): Op(NONE, NONE),
    ("DELETE", _S + "/checkpoint/{checkpoint_id}"): Op(data=NONE),
    ("POST", _S + "/snapshot"): Op("TakeSnapshot", "Snapshot", required=False),
    ("GET", _SN): Op(data="SnapshotList", query=snapshot_query(1000)),
    ("GET", _SN + "/public"): Op(data="SnapshotList", query=snapshot_query(100)),
    ("GET", _SN + "/public/{ref}"): Op(data="Snapshot"),
    ("GET", _SN + "/lineage"): Op(data="Lineage", query=(
        Param("snapshot", STRING, "an id or name:tag"), Param("name", STRING), Param("tag", STRING),
        limit(100, LINEAGE_MAX))),
    ("GET", _SN + "/{snapshot_id}"): Op(data="Snapshot"),
    ("PATCH", _SN + "/{snapshot_id}"): Op("TagSnapshot", "Snapshot"),
    ("POST", _SN + "/build"): Op("BuildSnapshot", "SnapshotBuild"),
    ("PUT", _SN + "/{snapshot_id}/upload"): Op(NONE, "Uploaded", takes="application/octet-stream",
                                               query=(Param("token", STRING, "the upload URL's token"),)),
    ("POST", _SN + "/{snapshot_id}/finalize"): Op("FinalizeSnapshot", "Snapshot", required=False),
    ("GET", _SN + "/{snapshot_id}/download"): Op(media="application/gzip"),
    ("POST", _S + "/fork"): Op("Fork", "Forked", required=False),
    ("POST", _S + "/pause"): Op("Pause", NONE, required=False, top="Paused"),
    ("POST", _S + "/resume"): Op(NONE, NONE),
    ("PUT", _S + "/network"): Op("SetNetwork", "Sandbox"),
    ("GET", _S + "/terminal"): Op(media="application/octet-stream", query=(
        Param("command", {"type": "array", "items": STRING}), Param("rows", _int(1, 1000, 24)),
        Param("cols", _int(1, 1000, 80)), Param("cwd", STRING), Param("term", STRING))),
    ("GET", "/sandbox/runtimes"): Op(data="RuntimeList", query=(
        limit(100, 1000), OFFSET, Param("sort", _one_of(("name", "created"))), DIRECTION)),
    ("POST", "/sandbox/runtimes/{name}/build"): Op(NONE, media="text/event-stream"),
    ("GET", "/sandbox/stats"): Op(data="Usage", query=(*WINDOW, PROJECT)),
    ("POST", _X + "/cancel"): Op(NONE, "Execution"),
    ("DELETE", _J + "/jobs/{job_id}"): Op(data="Job", query=(Param("force", BOOLEAN, "kill, not terminate"),)),
    ("DELETE", _SN + "/{snapshot_id}"): Op(data=NONE),
    ("DELETE", _S): Op(data=NONE),
    # Streams.
    ("POST", "/streams"): Op("CreateStream", "StreamCreated", required=False, top="StreamCreated"),
    ("PUT", "/streams/{stream_id}"): Op(NONE, "BytesTaken", takes="application/octet-stream"),
    ("GET", "/streams/{stream_id}"): Op(media="application/octet-stream"),
    ("GET", "/streams/{stream_id}/stdin"): Op(media="application/octet-stream"),  # between replicas
    ("GET", "/streams/audit/{sandbox_id}/{token}"): Op(media="application/x-ndjson", query=(
        Param("follow", BOOLEAN, "keep the stream open for new events (the default)"),)),
    # Tenancy and SSH keys.
    ("GET", "/orgs"): Op(data="OrgList"),
    ("POST", "/orgs"): Op("CreateOrg", "Org"),
    ("GET", "/orgs/{org_id}"): Op(data="Org"),
    ("PATCH", "/orgs/{org_id}/quota"): Op("SetQuota", "Org"),
    ("GET", "/projects"): Op(data="ProjectList"),
    ("POST", "/projects"): Op("CreateProject", "Project"),
    ("GET", "/keys"): Op(data="KeyList"),
    ("POST", "/keys"): Op("CreateKey", "Key"),
    ("DELETE", "/keys/{key_id}"): Op(data="Key"),
    ("GET", "/ssh-keys"): Op(data="SshKeyList"),
    ("POST", "/ssh-keys"): Op("AddSshKey", "SshKey"),
    ("DELETE", "/ssh-keys/{ssh_key_id}"): Op(data="SshKey"),
    # The node driver's machines (the server administrator's).
    ("GET", "/nodes"): Op(data="NodeList"),
    ("POST", "/nodes/{node}/drain"): Op("DrainNode", "NodeDrained", required=False),
    # The Agentuity CLI's calls.
    ("GET", "/cli/organization"): Op(data="CliOrgs"),
    ("GET", "/cli/auth/user"): Op(data="CliUser"),
    ("GET", "/cli/region"): Op(data="CliRegions"),
    ("GET", "/cli/sandbox"): Op(data="CliSandboxList", query=(
        Param("name", STRING), MODE, PROJECT, STATUS, limit(50, 1000), OFFSET, Param("sort", _one_of(CLI_SORTS)),
        DIRECTION)),
    ("GET", "/cli/sandbox/{sandbox_id}"): Op(data="CliSandbox"),
    ("GET", "/cli/project/{project_id}"): Op(data="CliProject"),
    ("POST", "/cli/validate/apt-dependencies"): Op("ValidateApt", "CliApt"),
    ("POST", "/cli/apikey"): Op("CliCreateKey", "CliKeyCreated"),
    ("GET", "/cli/apikey"): Op(data="CliKeyList", query=(PROJECT,)),
    ("GET", "/cli/apikey/{key_id}"): Op(data="CliKey"),
    ("DELETE", "/cli/apikey/{key_id}"): Op(data="Rows"),
    ("GET", "/services/stats/{org_id}"): Op(data="ServiceStats", query=WINDOW),
    **{(m, "/cli/{tail}"): Op(NONE, NONE) for m in ("GET", "POST", "PUT", "PATCH", "DELETE")},  # 501, by design
    # The server, the Web App, the port proxy.
    ("GET", "/"): Op(data=NONE, media="text/html"),  # a redirect to the Web App
    ("GET", "/healthz"): Op(data="Health"),
    ("GET", "/openapi.json"): Op(data=NONE),  # this document, not in the envelope (api/openapi.py)
    ("GET", "/metrics"): Op(media="text/plain"),
    ("GET", "/app"): Op(media="text/html"),
    ("GET", "/app/static/{name}"): Op(media="*/*"),
    ("GET", "/app/live"): Op(media="text/event-stream"),
    ("POST", "/app/session"): Op("SignIn", "Me"),
    ("GET", "/app/session"): Op(data="Me"),
    ("DELETE", "/app/session"): Op(data="SignedOut"),
    **{(m, path): Op(NONE, media="*/*", takes="*/*" if m in ("POST", "PUT", "PATCH") else None)
       for m in ("GET", "POST", "PUT", "PATCH", "DELETE")
       for path in ("/proxy/{sandbox_id}", "/proxy/{sandbox_id}/{tail}")},  # whatever the sandbox's port answers
}

__all__ = ["JSON", "NONE", "ROUTES", "Op", "Param"]
