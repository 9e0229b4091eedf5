"""GET /openapi.json: an OpenAPI 3.1 document of every route, served without a key, that covers
every endpoint the real @agentuity/core client's api-reference.ts names, and is linked from the
Web App. (tests/api/test_openapi_fuzz.py fuzzes a live server with it.)"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from hutch.api.openapi import document
from tests.api.conftest import STORE, WIRE, AppFactory

COMPAT = Path(__file__).resolve().parents[1] / "compat"
REFERENCE = COMPAT / "node_modules" / "@agentuity" / "core" / "dist" / "services" / "sandbox" / "api-reference.js"


@pytest.fixture
def driver_name() -> str:
    return "fake"


def shape(path: str) -> str:
    """A path template with its parameter names blanked: {sandboxId} and {sandbox_id} agree."""
    return re.sub(r"\{[^}]*\}", "{}", path)


def client_endpoints() -> list[tuple[str, str]]:
    """(method, path) of every endpoint of the real client's sandbox api-reference (Node reads it)."""
    if not REFERENCE.is_file():
        pytest.fail(f"{REFERENCE} is missing: run `npm ci` in tests/compat (scripts/install --dev does)",
                    pytrace=False)
    script = ("const m = await import(process.argv[1]);"
              "console.log(JSON.stringify(m.default.endpoints.map(e => [e.method, e.path])));")
    out = subprocess.run(["node", "--input-type=module", "-e", script, str(REFERENCE)], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    return [(m.upper(), p) for m, p in json.loads(out)]


@pytest.mark.runs_on(*WIRE)  # the route table alone
async def test_the_document_is_served_without_a_key_and_names_every_route(make_api: AppFactory) -> None:
    api = await make_api()
    resp = await api.client.get("/openapi.json")  # no Authorization header
    assert resp.status == 200, await resp.text()
    doc = await resp.json()
    assert doc["openapi"] == "3.1.0" and doc["servers"][0]["url"].startswith("http")
    described = {(m.upper(), shape(p)) for p, ops in doc["paths"].items() for m in ops}
    for route in api.client.app.router.routes():
        if route.method == "HEAD":
            continue
        info = route.resource.get_info()
        path = info.get("path") or info.get("formatter") or info["prefix"].rstrip("/") + "/{}"
        methods = ["GET", "POST", "PUT", "PATCH", "DELETE"] if route.method == "*" else [route.method]
        for method in methods:
            assert (method, shape(path)) in described, (method, path)
    # Operation ids are unique; a route served without a key says so; the envelope is the schema.
    ops = [op for ops in doc["paths"].values() for op in ops.values()]
    assert len({op["operationId"] for op in ops}) == len(ops)
    assert doc["paths"]["/streams/{stream_id}"]["get"]["security"] == []
    assert doc["paths"]["/openapi.json"]["get"]["security"] == []
    assert "security" not in doc["paths"]["/sandbox"]["post"]  # the document's default: a key
    assert doc["components"]["schemas"]["Envelope"]["required"] == ["success"]


def test_every_endpoint_the_real_client_uses_is_described(make_app_document: dict) -> None:  # type: ignore[type-arg]
    described = {(m.upper(), shape(p)) for p, ops in make_app_document["paths"].items() for m in ops}
    wanted = client_endpoints()
    assert len(wanted) >= 30, wanted  # the reference really was read
    missing = [(m, p) for m, p in wanted if (m, shape(p)) not in described]
    assert not missing, f"endpoints of @agentuity/core's api-reference missing from /openapi.json: {missing}"


def test_a_missing_route_would_be_caught(make_app_document: dict) -> None:  # type: ignore[type-arg]
    """The comparison above can fail: drop one route the client uses and it names it."""
    paths = {p: dict(ops) for p, ops in make_app_document["paths"].items()}
    del paths["/sandbox/{sandbox_id}/execute"]["post"]
    described = {(m.upper(), shape(p)) for p, ops in paths.items() for m in ops}
    missing = [(m, p) for m, p in client_endpoints() if (m, shape(p)) not in described]
    assert missing == [("POST", "/sandbox/{sandboxId}/execute")]


@pytest.fixture
def make_app_document(tmp_path: Path) -> dict:  # type: ignore[type-arg]
    from hutch.api.app import create_app
    from hutch.service.config import Config

    return document(create_app(Config(data_dir=tmp_path / "data", api_key="k", driver="fake")))


@pytest.mark.runs_on(*WIRE)  # a static page
async def test_the_web_app_links_the_document(make_api: AppFactory) -> None:
    api = await make_api()
    resp = await api.client.get("/app")
    assert resp.status == 200
    assert 'href="/openapi.json"' in await resp.text()


@pytest.mark.runs_on(*WIRE)  # routing alone
async def test_a_wrong_method_on_a_cli_path_is_405_and_an_unknown_cli_call_501(make_api: AppFactory) -> None:
    """Found by the fuzzing: the /cli/ catch-all answered 501 "hutch does not have that" to
    PUT /cli/apikey/{id}, a path hutch serves with other methods."""
    api = await make_api()
    body = await api.call("PUT", "/cli/apikey/key_x", expect=405)
    assert body["code"] == "METHOD_NOT_ALLOWED" and "DELETE, GET" in body["message"]
    resp = await api.client.put("/cli/auth/user", headers={"Authorization": "Bearer test-key"})
    assert resp.status == 405 and resp.headers["Allow"] == "GET"
    body = await api.call("GET", "/cli/agent/list", expect=501)
    assert body["code"] == "NOT_SUPPORTED" and "hutch" in body["message"]


def test_every_route_states_its_bodies_from_the_wire_schemas(make_app_document: dict) -> None:  # type: ignore[type-arg]
    from hutch.api.route_schemas import ROUTES
    from hutch.api.wire_schemas import SCHEMAS

    doc = make_app_document
    assert doc["components"]["schemas"].keys() >= SCHEMAS.keys()
    for (method, path), route in ROUTES.items():
        op = doc["paths"][path][method.lower()]
        if route.request:
            media = op["requestBody"]["content"]["application/json"]
            assert media["schema"] == {"$ref": f"#/components/schemas/{route.request}"}, (method, path)
            assert media["example"] is not None, (method, path)
        if route.data:
            ok = op["responses"]["2XX"]["content"]["application/json"]["schema"]
            assert ok["allOf"][1]["properties"]["data"] == {"$ref": f"#/components/schemas/{route.data}"}
        assert route.media in op["responses"]["2XX"]["content"], (method, path)
        # orgId on every route that needs a key, and only there.
        assert ("orgId" in {p["name"] for p in op["parameters"]}) == ("security" not in op), (method, path)
    # Found by the fuzzing: these were declared with another media type than they answer.
    ok = {(m, p): set(doc["paths"][p][m]["responses"]["2XX"]["content"]) for m, p in (
        ("get", "/fs/{sandbox_id}"), ("get", "/app/session"), ("get", "/fs/download/{sandbox_id}"))}
    assert ok[("get", "/fs/{sandbox_id}")] >= {"application/octet-stream"}
    assert ok[("get", "/app/session")] == {"application/json"}
    assert ok[("get", "/fs/download/{sandbox_id}")] >= {"application/gzip"}
    # The handlers' limits, as query parameters.
    listing = {p["name"]: p["schema"] for p in doc["paths"]["/sandbox"]["get"]["parameters"]}
    assert listing["limit"]["anyOf"][0]["maximum"] == 100 and listing["offset"]["anyOf"][0]["maximum"] == 10**9
    create = doc["components"]["schemas"]["CreateSandbox"]["properties"]
    assert create["command"]["anyOf"][0]["properties"]["mode"]["anyOf"][0]["enum"] == ["oneshot", "interactive"]
    assert doc["components"]["schemas"]["Sandbox"]["properties"]["sandboxId"]["pattern"].startswith("^sbx_")
    # Found by the fuzzing: this document is JSON but no envelope, and says so of itself.
    itself = doc["paths"]["/openapi.json"]["get"]["responses"]["2XX"]["content"]["application/json"]["schema"]
    assert itself["required"] == ["openapi", "paths"]


@pytest.mark.runs_on(*STORE)  # PostgreSQL's projections were the ones that stopped
async def test_a_nul_or_a_lone_surrogate_in_a_body_is_refused_and_the_projections_go_on(make_api: AppFactory) -> None:
    """Found by the fuzzing with the wire schemas: a sandbox named "a\\u0000b" was recorded, and
    PostgreSQL cannot hold a NUL, so the production profile's projections stopped at that event
    (every later write answered 503 PROJECTION_UNAVAILABLE). Such bodies are refused up front."""
    api = await make_api()
    for body, field in (('{"name": "a\\u0000b"}', "name"), ('{"metadata": {"k": ["x", "\\ud800"]}}', "metadata.k[1]"),
                        ('{"env": {"A\\u0000": "1"}}', "env.A\x00")):
        refused = await api.call("POST", "/sandbox", data=body, headers={"Content-Type": "application/json"},
                                 expect=400)
        assert refused["code"] == "INVALID_INPUT" and refused["field"] == field, refused
    sid = (await api.call("POST", "/sandbox", json={"name": "after"}, expect=201))["data"]["sandboxId"]
    assert (await api.data("GET", f"/sandbox/{sid}"))["name"] == "after"
