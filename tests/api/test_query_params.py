"""Every query parameter /openapi.json describes refuses a bad value with a 400 naming it and
what it accepts (api/query_params.py). The walk reads the served document, so a route added
with a declared parameter is covered without a line here."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.api.conftest import AUTH, AppFactory


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
        if "minimum" in schema:
            out.append((str(schema["minimum"] - 1), str(schema["minimum"])))
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
