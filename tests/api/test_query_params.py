"""Every query parameter /openapi.json describes refuses a bad value with a 400 naming it and
what it accepts (api/query_params.py). The walk reads the served document, so a route added
with a declared parameter is covered without a line here."""

from __future__ import annotations

import re
from typing import Any

import pytest
from aiohttp import web

from hutch.api.e2b.query_params import QUERY as E2B_QUERY
from hutch.api.e2b.server import create_e2b_app
from hutch.api.keys import ENGINE, TENANTS
from tests.api.conftest import AUTH, KEY, WIRE, AppFactory


@pytest.fixture
def driver_name() -> str:
    return "fake"


def bad_values(schema: dict[str, Any]) -> list[tuple[str, str]]:
    """(a bad value, a word the refusal must hold) for a parameter's schema."""
    schema = next((s for s in schema.get("anyOf", []) if "const" not in s), schema)
    if "enum" in schema:
        return [("nope", str(schema["enum"][0])), ("2", str(schema["enum"][0]))]
    kind = schema.get("type")
    if kind == "boolean":
        return [("2", "true or false"), ("maybe", "true or false"), ("", "")][:2]
    if kind == "integer":
        out = [("x", "integer"), ("1_0", "integer"), ("1.5", "integer"), (" 5", "integer")]
        if "maximum" in schema:
            out.append((str(schema["maximum"] + 1), str(schema["maximum"])))
            # Zeros first, past the 4,300 digits Python's int() takes (a 500 before): still its value.
            out.append(("0" * 5000 + str(schema["maximum"] + 1), str(schema["maximum"])))
        if "minimum" in schema:
            out.append((str(schema["minimum"] - 1), str(schema["minimum"])))
            if schema["minimum"] >= 0:
                out.append(("-" + "0" * 5000 + "1", str(schema["minimum"])))
        return out
    if "pattern" in schema and "duration" in schema.get("description", ""):
        return [("soon", "duration"), ("-5s", "duration")]
    return []


async def test_every_described_query_parameter_refuses_a_bad_value_by_name(make_api: AppFactory) -> None:
    api = await make_api()
    doc = await (await api.client.get("/openapi.json")).json()
    walked, wrong = 0, []
    for path, ops in doc["paths"].items():
        url = re.sub(r"\{[^}]*\}", "x", path)
        for method, op in ops.items():
            for param in op.get("parameters", []):
                if param["in"] != "query":
                    continue
                for value, word in bad_values(param["schema"]):
                    resp = await api.client.request(method.upper(), url, params={param["name"]: value},
                                                    headers=AUTH)
                    body = await resp.json()
                    where = f"{method.upper()} {path}?{param['name']}={value!r}"
                    if resp.status != 400 or not body["message"].startswith(param["name"] + ":") \
                            or word not in body["message"]:
                        wrong.append((where, resp.status, body.get("message")))
                    walked += 1
    assert not wrong, "\n".join(map(str, wrong))
    assert walked > 100  # the walk found the parameters: an empty document would pass it


@pytest.mark.parametrize("value", ["true", "false", "1", "0", "True", "FALSE", ""])
async def test_a_boolean_takes_what_the_clients_send(make_api: AppFactory, value: str) -> None:
    api = await make_api()
    await api.call("GET", "/sandbox", params={"live": value, "deletedOnly": value})


async def test_the_events_route_takes_its_direction_and_refuses_a_bad_one(make_api: AppFactory) -> None:
    api = await make_api()
    sid = (await api.call("POST", "/sandbox", json={"name": "q"}, expect=201))["data"]["sandboxId"]
    for direction in ("asc", "desc"):
        await api.call("GET", f"/sandbox/sandboxes/{sid}/events", params={"direction": direction, "limit": "5"})
    refused = await api.call("GET", f"/sandbox/sandboxes/{sid}/events", params={"direction": "2"}, expect=400)
    assert refused["message"] == "direction: expected one of asc, desc, got '2'"


# E2B's wire (api/e2b/server.py) has no document of its own: its query parameters are declared
# in api/e2b/query_params.py, as E2B's documents declare them, and walked from there.


async def _e2b(make_api: AppFactory, aiohttp_client: Any) -> tuple[Any, web.Application]:
    api = await make_api()
    app = create_e2b_app(api.client.server.app[ENGINE], api.client.server.app[TENANTS])
    return await aiohttp_client(app), app


def _routes(app: web.Application) -> set[tuple[str, str]]:
    return {("GET" if route.method == "HEAD" else route.method, resource.canonical)
            for resource in app.router.resources() for route in resource}


def _good_value(schema: dict[str, Any]) -> str:
    if schema.get("type") == "array":
        return _good_value(schema["items"])
    if "enum" in schema:
        return str(schema["enum"][0])
    if schema.get("type") == "integer":
        return str(schema.get("minimum", 1))
    return "2026-11-30T06:00:00Z" if schema.get("format") == "date-time" else "x"


def e2b_bad_values(schema: dict[str, Any]) -> list[tuple[str, str]]:
    """(a bad value, a word the refusal must hold) for a parameter of the E2B wire."""
    if schema.get("type") == "array":
        items = schema["items"]
        out = [(f"{_good_value(items)},{value}", word) for value, word in bad_values(items)]
        if "maxItems" in schema:
            out.append((",".join(f"i{n}" for n in range(schema["maxItems"] + 1)), str(schema["maxItems"])))
        return out
    if schema.get("format") == "date-time":
        return [("yesterday", "ISO 8601"), ("2026-11-30T06:00:00", "time zone")]
    return bad_values(schema)


@pytest.mark.runs_on(*WIRE)
async def test_every_e2b_route_declares_its_query(make_api: AppFactory, aiohttp_client: Any) -> None:
    """A route added to the E2B wire says what it reads of the query (nothing: an empty entry),
    so none reads a value no one checks; and the table names no route the wire lacks."""
    _client, app = await _e2b(make_api, aiohttp_client)
    served = _routes(app)
    assert served - set(E2B_QUERY) == set(), "routes of the E2B wire missing from api/e2b/query_params.py"
    assert set(E2B_QUERY) - served == set(), "api/e2b/query_params.py names routes the E2B wire lacks"


@pytest.mark.runs_on(*WIRE)
async def test_every_e2b_query_parameter_refuses_a_bad_value_by_name(make_api: AppFactory,
                                                                     aiohttp_client: Any) -> None:
    """Each bad value alone, and after a good one (a second value is no way past the check:
    the handler reads the first, a proxy in front may read the last). Refused before the key
    or the sandbox is looked at, in E2B's error shape, whichever plane the route is on."""
    client, _app = await _e2b(make_api, aiohttp_client)
    headers = {"X-API-Key": KEY, "E2b-Sandbox-Id": "x"}
    walked, wrong = 0, []
    for (method, path), params in E2B_QUERY.items():
        url = re.sub(r"\{[^}]*\}", "x", path)
        for param in params:
            good = _good_value(param.schema)
            for value, word in e2b_bad_values(param.schema):
                for query in ([(param.name, value)], [(param.name, good), (param.name, value)]):
                    resp = await client.request(method, url, params=query, headers=headers)
                    body = await resp.json()
                    if resp.status != 400 or body.get("code") != 400 \
                            or not body["message"].startswith(param.name + ":") or word not in body["message"]:
                        wrong.append((f"{method} {path}?{query}", resp.status, body))
                    walked += 1
    assert not wrong, "\n".join(map(str, wrong))
    assert walked > 40  # the walk found the parameters: an empty table would pass it


@pytest.mark.runs_on(*WIRE)
@pytest.mark.parametrize(("path", "says"), [
    ("/v2/sandboxes?limit=-1", "limit: must be between 1 and 100, got '-1'"),
    ("/v2/sandboxes?limit=abc", "limit: expected an integer, got 'abc'"),
    ("/v2/sandboxes?limit=5&limit=abc", "limit: expected an integer, got 'abc'"),
    ("/v2/sandboxes?state=bogus", "state: expected one of running, paused, got 'bogus'"),
    ("/v2/sandboxes?state=running&state=bogus", "state: expected one of running, paused, got 'bogus'"),
    ("/v2/sandboxes?order=up", "order: expected one of asc, desc, got 'up'"),
    ("/sandboxes/x/metrics?start=notanumber", "start: expected an integer, got 'notanumber'"),
    ("/sandboxes/x/metrics?end=1&end=-1", "end: must be between 0 and 9223372036854775807, got '-1'"),
    ("/sandboxes/x/metrics?start=" + "9" * 40, "start: must be between 0 and 9223372036854775807, got '" + "9" * 40 + "'"),
    ("/snapshots?limit=10&limit=1000", "limit: must be between 1 and 100, got '1000'"),
    ("/files?path=a&signature_expiration=soon", "signature_expiration: expected an integer, got 'soon'"),
])
async def test_a_bad_e2b_query_value_is_a_400_naming_it(make_api: AppFactory, aiohttp_client: Any, path: str,
                                                        says: str) -> None:
    client, _app = await _e2b(make_api, aiohttp_client)
    resp = await client.get(path, headers={"X-API-Key": KEY})
    assert (resp.status, await resp.json()) == (400, {"code": 400, "message": says})


@pytest.mark.runs_on(*WIRE)
async def test_the_e2b_listing_takes_what_the_sdks_send(make_api: AppFactory, aiohttp_client: Any) -> None:
    """E2B's SDKs' values (e2b 2.63.0's get_v2_sandboxes, get_snapshots, metrics): a comma-joined
    state, an order, an offset-aware startedAfter, limit, and an empty value as left out."""
    client, _app = await _e2b(make_api, aiohttp_client)
    made = await client.post("/sandboxes", json={"templateID": "base"}, headers={"X-API-Key": KEY})
    sandbox = (await made.json())["sandboxID"]
    for query in ("state=running,paused&order=asc&limit=100", "state=running&startedAfter=2020-01-01T00:00:00%2B00:00",
                  "state=paused,running&order=desc&limit=1&template=base", "state=&order=&startedAfter="):
        resp = await client.get(f"/v2/sandboxes?{query}", headers={"X-API-Key": KEY})
        listed = await resp.json()
        assert resp.status == 200, (query, listed)
        assert [s["sandboxID"] for s in listed] == [sandbox], query
    for path in (f"/sandboxes/{sandbox}/metrics?start=0&end=99999999999", "/snapshots?limit=100",
                 f"/snapshots?sandboxID={sandbox}&limit=1"):
        resp = await client.get(path, headers={"X-API-Key": KEY})
        assert resp.status in (200, 501), (path, await resp.json())  # 501: the fake driver has no metrics


@pytest.mark.runs_on(*WIRE)
async def test_an_e2b_page_token_zero_padded_past_4300_digits_is_read(make_api: AppFactory,
                                                                     aiohttp_client: Any) -> None:
    """A snapshot listing's nextToken is an offset: "0…01" with thousands of zeros is offset 1
    (int() of more than 4,300 digits raised ValueError, a 500), a page past the end, empty."""
    client, _app = await _e2b(make_api, aiohttp_client)
    resp = await client.get("/snapshots?nextToken=" + "0" * 5000 + "1", headers={"X-API-Key": KEY})
    assert (resp.status, await resp.json()) == (200, [])


@pytest.mark.runs_on(*WIRE)
async def test_a_signed_urls_malformed_expiration_is_a_400_before_its_signature(make_api: AppFactory,
                                                                               aiohttp_client: Any) -> None:
    """At a sandbox's envd host a signed URL is checked before the routes (api/e2b/signed.py):
    its expiration's form is told as on every route, then the signature; an empty one is left out."""
    api = await make_api()
    client = await aiohttp_client(create_e2b_app(api.client.server.app[ENGINE], api.client.server.app[TENANTS],
                                                 "e2b.test"))
    made = await (await client.post("/sandboxes", json={"templateID": "base"}, headers={"X-API-Key": KEY})).json()
    host = {"Host": f"49983-{made['sandboxID']}.e2b.test"}
    resp = await client.get("/files?path=a&signature=v1_x&signature_expiration=soon", headers=host)
    assert (resp.status, await resp.json()) == (400, {
        "code": 400, "message": "signature_expiration: expected an integer, got 'soon'"})
    resp = await client.get("/files?path=a&signature=v1_x&signature_expiration=", headers=host)
    assert (resp.status, await resp.json()) == (401, {"code": 401, "message": "signature: not a v1 signature"})
