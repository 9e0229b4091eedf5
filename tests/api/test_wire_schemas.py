"""api/wire_schemas.py is the wire's one description: each request schema accepts its example
and refuses it without any one required field, and the server does the same (it takes the
example, and refuses each required field's absence naming that field); each renderer's fully
populated output fits its schema, names every field the schema has and no other; every route's
success answer on the server fits its data schema."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterator
from typing import Any

import attrs
import jsonschema
import pytest

from hutch.api import parse, render
from hutch.api.openapi import document
from hutch.api.route_schemas import JSON, NONE, ROUTES
from hutch.api.routes import checkpoints
from hutch.api.wire_schemas import EXAMPLES, SCHEMAS, Schema
from hutch.core import ids
from hutch.core.models import (
    CheckpointState,
    ExecutionState,
    ExecutionStatus,
    Mode,
    NetworkSpec,
    ResourceSpec,
    SandboxSpec,
    SandboxState,
    SandboxStatus,
    SnapshotFile,
    SnapshotState,
    SnapshotStatus,
    TimeoutSpec,
)
from hutch.drivers.base import Usage
from tests.api.conftest import WIRE, AppFactory

HELLO_B64 = "aGVsbG8K"
SSH_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIC/1Rr6FP4rnldeo8MVNjQS92985lw2P6EnTUezYkIoT every"
SSH_KEY_2 = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIANOIyjaSvSZYb2o4xzMO7pSJ0PYmqn3N2aDQuJAo0RM other"
SBX, EXC, SNP, CKPT = (ids.new_id(kind) for kind in ("sandbox", "execution", "snapshot", "checkpoint"))
AT, LATER = "2026-11-26T10:00:00Z", "2026-11-26T10:01:00Z"


@pytest.fixture
def driver_name() -> str:
    return "fake"


def valid(schema: Schema, value: Any) -> bool:
    return jsonschema.Draft202012Validator(schema).is_valid(value)


def unwrap(schema: Schema) -> Schema:
    """An optional field's own schema: ``anyOf`` it or null (``nullable_optionals``)."""
    for sub in schema.get("anyOf", ()):
        if sub.get("type") != "null":
            return unwrap(sub)
    return schema


def required_paths(schema: Schema, value: Any, at: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Where ``value`` holds a field its schema requires: each such field's key path."""
    schema = unwrap(schema)
    if isinstance(value, dict):
        for key in schema.get("required", []):
            if key in value:
                yield (*at, key)
        for key, sub in schema.get("properties", {}).items():
            if key in value:
                yield from required_paths(sub, value[key], (*at, key))
    elif isinstance(value, list) and value and "items" in schema:
        yield from required_paths(schema["items"], value[0], (*at, 0))


def without(value: Any, path: tuple[Any, ...]) -> Any:
    if len(path) == 1:
        return {k: v for k, v in value.items() if k != path[0]} if isinstance(value, dict) else value
    head, rest = path[0], path[1:]
    if isinstance(value, list):
        return [without(v, rest) if i == head else v for i, v in enumerate(value)]
    return {**value, head: without(value[head], rest)}


def field_name(path: tuple[Any, ...]) -> str:
    """The server's name for a field: ``files[0].path``, ``command.exec``."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def test_every_route_names_known_schemas_and_every_request_schema_has_a_valid_example() -> None:
    for op in ROUTES.values():
        assert op.request in (None, NONE) or op.request in EXAMPLES
        for name in (op.data, op.top):
            assert name in (None, NONE) or name in SCHEMAS
    for name, example in EXAMPLES.items():
        jsonschema.Draft202012Validator.check_schema(SCHEMAS[name])
        assert valid(SCHEMAS[name], example), name


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_each_required_field_is_required_by_the_schema(name: str) -> None:
    paths = list(required_paths(SCHEMAS[name], EXAMPLES[name]))
    for path in paths:
        assert not valid(SCHEMAS[name], without(EXAMPLES[name], path)), (name, path)
    assert not valid(SCHEMAS[name], []) and not valid(SCHEMAS[name], "x")


def test_create_and_execute_examples_parse() -> None:
    req = parse.parse_create(EXAMPLES["CreateSandbox"])
    assert req.spec.runtime == "base:latest" and req.command == ("cat", "hello.txt") and len(req.files) == 1
    assert parse.parse_execute(EXAMPLES["Execute"]).timeout == 30.0
    assert parse.parse_job(EXAMPLES["StartJob"]) == ("sleep", "1")


def _fills(schema: Schema, rendered: list[dict[str, Any]]) -> None:
    """The renderings fit the schema and, together, name exactly its fields."""
    for one in rendered:
        jsonschema.validate(one, schema, cls=jsonschema.Draft202012Validator)
    assert set().union(*rendered) == set(schema["properties"])


def test_the_renderers_fit_their_schemas_field_for_field() -> None:
    spec = SandboxSpec(runtime="base:latest", runtime_id="srt_base", mode=Mode.ONESHOT, name="n", description="d",
                       resources=ResourceSpec(memory="512Mi", cpu="1", disk="1Gi"), env={"A": "1"},
                       network=NetworkSpec(enabled=True, port=3000, allow=("pypi.org",)),
                       timeout=TimeoutSpec(idle="1m", execution="2m", paused="3m"), command=("true",),
                       metadata={"k": "v"}, project_id="proj_x", snapshot_id=SNP, dependencies=("curl",),
                       packages=("zod",), command_omitted_bytes=10, command_sha256="00")
    sb = SandboxState(sandbox_id=SBX, spec=spec, status=SandboxStatus.TERMINATED, created_at=AT, updated_at=LATER,
                 executions=1, exit_code=0, reason="done", cpu_seconds=1.5, memory_peak_bytes=2**20)
    denying = attrs.evolve(sb, spec=attrs.evolve(spec, network=NetworkSpec(enabled=True, deny=("192.0.2.0/24",))))
    _fills(SCHEMAS["Sandbox"], [render.sandbox_info(sb, ("http://h/o", "http://h/e"), "http://h/p",
                                                  Usage(cpu_seconds=2.0, memory_peak_bytes=2**21), "n1"),
                                render.sandbox_info(denying, ("http://h/o", "http://h/e"), None, None, None)])
    ex = ExecutionState(execution_id=EXC, sandbox_id=SBX, command=("echo",), status=ExecutionStatus.FAILED, created_at=AT,
                   started_at=AT, completed_at=LATER, exit_code=1, duration_ms=5, error="e", output_truncated=True,
                   command_omitted_bytes=10, command_sha256="00")
    _fills(SCHEMAS["Execution"], [render.execution_info(ex, "http://h/o", "http://h/e")])
    _fills(SCHEMAS["Job"], [render.job_info(ex, "http://h/o", "http://h/e")])
    snap = SnapshotState(snapshot_id=SNP, name="n", runtime="base:latest", runtime_id="srt_base",
                    status=SnapshotStatus.READY, created_at=AT, updated_at=AT, tag="v1", description="d", message="m",
                    source_sandbox_id=SBX, parent_snapshot_id=SNP, size_bytes=3, file_count=1,
                    files=(SnapshotFile(path="a", size=3, sha256="00", mode=0o644),), env={"A": "1"},
                    metadata={"k": "v"}, dependencies=("curl",), packages=("zod",), project_id="proj_x")
    public = attrs.evolve(snap, public=True)
    _fills(SCHEMAS["Snapshot"], [render.snapshot_info(snap, "http://h/d"), render.snapshot_info(public, "http://h/d")])
    _fills(SCHEMAS["Checkpoint"], [checkpoints.render(CheckpointState(checkpoint_id=CKPT, name="c", created_at=AT,
                                                                 parent="b"))])


def _data_fits(method: str, template: str, body: dict[str, Any]) -> None:
    name = ROUTES[(method, template)].data
    if name:
        jsonschema.validate(body["data"], SCHEMAS[name], cls=jsonschema.Draft202012Validator)


def generic(schema: Schema) -> bool:
    """A schema that says nothing: any value, or any object."""
    return not (set(schema) - {"type", "description"}) and schema.get("type") in (None, "object")


@pytest.mark.runs_on(*WIRE)  # the route table alone
async def test_every_operation_of_the_live_router_is_described(make_api: AppFactory) -> None:
    api = await make_api()
    doc = document(api.client.app)
    operations = [(m.upper(), path, op) for path, ops in doc["paths"].items() for m, op in ops.items()]
    assert len(operations) >= 99 and len(operations) == len(ROUTES)
    undescribed = []
    for method, path, op in operations:
        route = ROUTES.get((method, path))
        if route is None:
            undescribed.append((method, path, "not in ROUTES"))
            continue
        if method in ("POST", "PUT", "PATCH") and route.takes is None and route.request is None:
            undescribed.append((method, path, "its body"))
        if route.media == JSON and route.data is None:
            undescribed.append((method, path, "its answer"))
        body = op.get("requestBody", {}).get("content", {}).get(JSON)
        if body is not None and generic(body["schema"]):
            undescribed.append((method, path, "a generic body"))
        for name in (route.request, route.data, route.top):
            if name and generic(SCHEMAS[name]) and name != "Empty":
                undescribed.append((method, path, f"generic {name}"))
    assert not undescribed, undescribed


# The main routes, whose examples and refusals this test walks in order (every operation is
# called by test_every_operation_answers_as_described).
ORIGINAL = {("POST", "/sandbox"), ("GET", "/sandbox"), ("GET", "/sandbox/{sandbox_id}"),
            ("GET", "/sandbox/status/{sandbox_id}"), ("POST", "/sandbox/{sandbox_id}/execute"),
            ("GET", "/sandbox/execution/{execution_id}"), ("GET", "/sandbox/sandboxes/{sandbox_id}/executions"),
            ("POST", "/sandbox/sandboxes/{sandbox_id}/jobs"), ("GET", "/sandbox/sandboxes/{sandbox_id}/jobs"),
            ("GET", "/sandbox/sandboxes/{sandbox_id}/jobs/{job_id}"), ("PATCH", "/sandbox/env/{sandbox_id}"),
            ("POST", "/fs/{sandbox_id}"), ("POST", "/fs/mkdir/{sandbox_id}"), ("POST", "/fs/rm/{sandbox_id}"),
            ("POST", "/fs/rmdir/{sandbox_id}"), ("POST", "/sandbox/{sandbox_id}/snapshot"),
            ("GET", "/sandbox/snapshots"), ("GET", "/sandbox/snapshots/{snapshot_id}"),
            ("PATCH", "/sandbox/snapshots/{snapshot_id}"), ("POST", "/sandbox/{sandbox_id}/checkpoint"),
            ("GET", "/sandbox/checkpoints/{sandbox_id}")}


async def test_the_server_takes_each_example_refuses_each_missing_field_and_answers_as_described(
        make_api: AppFactory) -> None:
    api = await make_api()
    known: dict[str, str] = {}
    refused_fields = []
    for (method, template), bodies in ROUTES.items():  # in order: what makes an id comes first
        if (method, template) not in ORIGINAL:
            continue
        path = template.format(**known) if "{" in template else template
        if bodies.request:
            example, schema = EXAMPLES[bodies.request], SCHEMAS[bodies.request]
            for missing in required_paths(schema, example):
                refused = await api.call(method, path, json=without(example, missing), expect=400)
                assert refused["field"] == field_name(missing), (method, template, refused)
                refused_fields.append(refused["field"])
        resp = await api.client.request(method, path, headers={"Authorization": "Bearer test-key"},
                                        json=EXAMPLES[bodies.request] if bodies.request else None)
        answer = await resp.json()
        assert 200 <= resp.status < 300, (method, template, resp.status, answer)
        _data_fits(method, template, answer)
        data = answer.get("data") or {}
        for key, param in (("sandboxId", "sandbox_id"), ("executionId", "execution_id"),
                           ("snapshotId", "snapshot_id"), ("jobId", "job_id")):
            if isinstance(data, dict) and key in data:
                known.setdefault(param, data[key])
    assert {"command.exec", "files[0].path", "files[0].content", "command", "env", "path", "tag", "name"} <= set(
        refused_fields), refused_fields


# ------------------------------------------------------------ every operation, live

# Not called: they stay open by design (a websocket, server-sent events) or forward to a
# sandbox's port, which the fake driver has none of; the fuzzing covers what they answer.
# The terminal and live websockets; a stdin stream read between replicas (its token is the
# replicas' shared secret's: tests/cluster/test_replicas.py calls it); the port proxy.
# The nodes' routes answer NotSupported on the fake driver: tests/api/test_node_fleet.py calls
# them on the node driver and holds their answers to these schemas.
NOT_CALLED = {("GET", "/sandbox/{sandbox_id}/terminal"), ("GET", "/app/live"),
              ("GET", "/streams/{stream_id}/stdin"), ("GET", "/nodes"), ("POST", "/nodes/{node}/drain")} | {
    (m, p) for m, p in ROUTES if p.startswith("/proxy/")}


def tar_gz() -> bytes:
    """An empty tar, gzipped: what the archive uploads take."""
    buf = io.BytesIO()
    tarfile.open(fileobj=buf, mode="w:gz").close()
    return buf.getvalue()


QUERIES = {("GET", "/fs/{sandbox_id}"): "path=hello.txt", ("GET", "/sandbox/snapshots/lineage"): "snapshot={snapshot_id}",
           ("GET", "/streams/audit/{sandbox_id}/{token}"): "follow=false"}


async def _made(api: Any, method: str, path: str, body: dict[str, Any]) -> Any:
    resp = await api.client.request(method, path, headers={"Authorization": "Bearer test-key"}, json=body)
    answer = await resp.json()
    assert 200 <= resp.status < 300, (method, path, answer)
    return answer["data"]


async def _ids(api: Any) -> dict[str, str]:
    """A real id for every path parameter: what the operations act on."""
    made = await _made(api, "POST", "/sandbox", {"runtime": "base:latest",
                                                    "files": [{"path": "hello.txt", "content": HELLO_B64}]})
    sid = made["sandboxId"]
    out = {"sandbox_id": sid, "token": made["auditStreamUrl"].rsplit("/", 1)[1], "org_id": "org_local",
           "name": "base:latest", "tail": "agent/list"}
    ran = await _made(api, "POST", f"/sandbox/{sid}/execute", {"command": ["echo", "hi"]})
    out["execution_id"], out["output_id"] = ran["executionId"], ran["stdoutStreamUrl"].rsplit("/", 1)[1]
    await api.wait_execution(out["execution_id"])
    out["job_id"] = (await _made(api, "POST", f"/sandbox/sandboxes/{sid}/jobs", {"command": ["true"]}))["jobId"]
    await api.wait_execution(out["job_id"])  # a checkpoint is restored with nothing running
    snap = await _made(api, "POST", f"/sandbox/{sid}/snapshot", {"name": "every", "public": True})
    out["snapshot_id"], out["ref"] = snap["snapshotId"], snap["snapshotId"]
    out["checkpoint_id"] = (await _made(api, "POST", f"/sandbox/{sid}/checkpoint", {"name": "cp"}))["id"]
    out["stream_id"] = (await _made(api, "POST", "/streams", {}))["id"]
    out["project_id"] = (await _made(api, "POST", "/projects", {"name": f"p{sid[-6:]}"}))["id"]
    out["key_id"] = (await _made(api, "POST", "/keys", {"role": "member"}))["id"]
    out["ssh_key_id"] = (await _made(api, "POST", "/ssh-keys", {"publicKey": SSH_KEY}))["id"]
    build = await _made(api, "POST", "/sandbox/snapshots/build", {"runtime": "base:latest", "name": "upload"})
    out["build_id"] = build["snapshotId"]
    return out


def _path(method: str, template: str, known: dict[str, str]) -> str:
    if template.startswith("/sandbox/snapshots/{snapshot_id}/") and template.endswith(("/upload", "/finalize")):
        known = {**known, "snapshot_id": known["build_id"]}  # a build's snapshot, not a taken one
    if (method, template) == ("GET", "/streams/{stream_id}"):
        known = {**known, "stream_id": known["output_id"]}  # an output stream (the other is a stdin's)
    if template == "/app/static/{name}":
        known = {**known, "name": "app.js"}
    if template.startswith(("/keys/", "/cli/apikey/")):
        known = {**known, "key_id": known["cli_key_id" if template.startswith("/cli/") else "key_id"]}
    return template.format(**known)


def _nulls(name: str) -> dict[str, Any]:
    """The request with every optional field null (the parsers read null as left out)."""
    schema, example = SCHEMAS[name], EXAMPLES[name]
    required = set(schema.get("required", ()))
    return {k: example[k] if k in required else None for k in schema.get("properties", {})}


def _ordered() -> list[tuple[str, str]]:
    """A restore, a pause and a resume first (nothing may run then); deletes last, the sandbox's own at the very end:
    the rest act on what they would remove."""
    keys = [k for k in ROUTES if k not in NOT_CALLED]
    first = [("POST", "/sandbox/{sandbox_id}/checkpoint/{checkpoint_id}/restore"),  # before commands run
             ("POST", "/sandbox/{sandbox_id}/pause"), ("POST", "/sandbox/{sandbox_id}/resume")]
    return sorted(keys, key=lambda k: (k not in first, first.index(k) if k in first else 0, k[0] == "DELETE",
                                       k == ("DELETE", "/sandbox/{sandbox_id}")))


async def _call(api: Any, method: str, template: str, known: dict[str, str], variant: str) -> None:
    op = ROUTES[(method, template)]
    path = _path(method, template, known)
    if query := QUERIES.get((method, template)):
        path += "?" + query.format(**known)
    kw: dict[str, Any] = {}
    if op.takes:
        kw["data"] = tar_gz()
    elif op.request:
        kw["json"] = EXAMPLES[op.request] if variant == "examples" else _nulls(op.request)
        if op.request == "CreateOrg":
            kw["json"] = {**kw["json"], "name": f"{variant}-{known['sandbox_id'][-6:]}"}
        if op.request == "AddSshKey" and variant == "nulls":
            kw["json"] = {"publicKey": SSH_KEY_2, "name": None}
    resp = await api.client.request(method, path, headers={"Authorization": "Bearer test-key"}, **kw)
    where = (variant, method, template, resp.status)
    if template == "/cli/{tail}":
        assert resp.status == 501, where  # by design: what hutch does not have
        return
    assert 200 <= resp.status < 300, (*where, (await resp.read())[:300])
    if resp.content_type != JSON:
        assert (op.media != JSON and resp.content_type == op.media.split(";")[0]) or op.media == "*/*", where
        return
    answer = await resp.json()
    if template == "/openapi.json":
        return
    for name in (op.data, op.top):
        if name:
            value = answer["data"] if name == op.data else answer
            jsonschema.validate(value, SCHEMAS[name], cls=jsonschema.Draft202012Validator)
    if template == "/cli/apikey" and method == "POST":
        known["cli_key_id"] = answer["data"]["id"]


@pytest.mark.parametrize("variant", ["examples", "nulls"])
async def test_every_operation_answers_as_described(make_api: AppFactory, variant: str) -> None:
    """Every operation of a live server, once with its examples and once with every optional
    field null: a success, its answer as its schema has it (both profiles)."""
    api = await make_api()
    known = await _ids(api)
    known["cli_key_id"] = (await _made(api, "POST", "/cli/apikey", {"name": "pre"}))["id"]
    called = 0
    for method, template in _ordered():
        await _call(api, method, template, known, variant)
        called += 1
    assert called == len(ROUTES) - len(NOT_CALLED)
