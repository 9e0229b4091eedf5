"""What the fuzzing (tests/api/test_openapi_fuzz.py) found, held: each bad input is a 400
naming its field, where it was a 500 or was taken as something else; on both profiles where
the store sees the value."""

from __future__ import annotations

from typing import Any

import pytest

from hutch.api.http import MAX_OFFSET
from tests.api.conftest import WIRE, Api, AppFactory


@pytest.fixture
def driver_name() -> str:
    return "fake"


async def refused(api: Api, method: str, path: str, field: str, body: Any = None) -> str:
    answer = await api.call(method, path, json=body, expect=400)
    assert answer["field"] == field, answer
    return str(answer["message"])


@pytest.mark.runs_on(*WIRE)  # refused while parsing
async def test_a_usage_window_that_is_not_a_time_is_refused(make_api: AppFactory) -> None:
    # It was a 500: the usage sums parsed it unchecked.
    assert "ISO 8601" in await refused(await make_api(), "GET", "/services/stats/org_local?start=yesterday", "start")


@pytest.mark.parametrize("path", ["/sandbox", "/sandbox/snapshots", "/cli/sandbox", "/sandbox/runtimes"])
async def test_an_offset_past_the_cap_is_refused(make_api: AppFactory, path: str) -> None:
    # Past a bigint it was a 500 on PostgreSQL; the cap leaves every real list inside it.
    api = await make_api()
    assert str(MAX_OFFSET) in await refused(api, "GET", f"{path}?offset={2**64}", "offset")
    await api.call("GET", f"{path}?offset={MAX_OFFSET}")


@pytest.mark.runs_on(*WIRE)  # refused while parsing, before PostgreSQL sees it
async def test_a_nul_in_a_query_value_is_refused(make_api: AppFactory) -> None:
    # A 500 on PostgreSQL, whose text cannot hold it.
    assert "NUL" in await refused(await make_api(), "GET", "/sandbox?name=a%00b", "name")


@pytest.mark.runs_on(*WIRE)  # refused while parsing
async def test_a_stream_name_that_is_not_a_string_is_refused(make_api: AppFactory) -> None:
    # It was silently dropped.
    await refused(await make_api(), "POST", "/streams", "name", {"name": 5})


@pytest.mark.runs_on(*WIRE)  # refused while parsing
@pytest.mark.parametrize(("path", "body", "field"), [
    ("/keys", {"name": "k", "role": "member", "projects": {}}, "projects"),
    ("/cli/apikey", {"name": "k", "projectId": {}}, "projectId"),
    ("/sandbox", {"runtime": "base:latest", "command": {}}, "command.exec"),
])
async def test_an_empty_object_is_not_taken_as_none(make_api: AppFactory, path: str, body: dict[str, Any],
                                                    field: str) -> None:
    await refused(await make_api(), "POST", path, field, body)


@pytest.mark.runs_on(*WIRE)  # refused while parsing
@pytest.mark.parametrize("org", [5, "org_other"])
async def test_a_body_org_must_agree_with_the_query_org(make_api: AppFactory, org: object) -> None:
    # The query's won silently, a bad body orgId unread.
    api = await make_api()
    assert "differ" in await refused(api, "POST", "/sandbox?orgId=org_local", "orgId",
                                     {"runtime": "base:latest", "orgId": org})
    await api.call("POST", "/sandbox?orgId=org_local", json={"runtime": "base:latest", "orgId": "org_local"},
                   expect=201)
    await api.call("POST", "/sandbox?orgId=org_local", json={"runtime": "base:latest", "orgId": None}, expect=201)


@pytest.mark.runs_on(*WIRE)  # refused while parsing
@pytest.mark.parametrize(("where", "value"), [
    ("timeout.paused", "999999999999d"),  # past timedelta: pausing the sandbox was then a 500, every time
    ("timeout.paused", "3000000d"),  # a deadline past the year 9999: the same
    ("timeout.idle", "9" * 400 + "d"),  # infinity to Python: E2B's GET of the sandbox was a 500
    ("timeout.idle", "9" * 1_000_001 + "d"),  # past Decimal's exponent: a 500 at the create (decimal.Overflow)
    ("timeout.execution", "36501d"),
])
async def test_a_sandbox_timeout_past_any_life_is_refused_at_its_create(make_api: AppFactory, where: str,
                                                                         value: str) -> None:
    """A timeout is checked for its form at the create, and was used later: a ``timeout.paused``
    of a million years made every pause of the sandbox an internal error (its deadline is no
    date), an idle one of 10^400 days was infinity. Past 100 years, each is a 400 naming it."""
    api = await make_api()
    key = where.split(".")[1]
    assert "36500d" in await refused(api, "POST", "/sandbox", where, {"timeout": {key: value}})
    made = await api.data("POST", "/sandbox", json={"timeout": {key: "36500d"}}, expect=201)
    await api.call("POST", f"/sandbox/{made['sandboxId']}/pause")


@pytest.mark.runs_on(*WIRE)  # refused while parsing
async def test_a_duration_past_any_life_is_refused_where_a_command_or_a_wait_takes_one(make_api: AppFactory) -> None:
    api = await make_api()
    sid = (await api.data("POST", "/sandbox", json={}, expect=201))["sandboxId"]
    assert "36500d" in await refused(api, "POST", f"/sandbox/{sid}/execute", "timeout",
                                     {"command": ["true"], "timeout": "9" * 400 + "d"})
    assert "36500d" in await refused(api, "GET", "/sandbox/execution/exec_x?wait=" + "9" * 400 + "d", "wait")
