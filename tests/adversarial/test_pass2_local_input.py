"""Second adversarial pass, input: what a client can put in a request line, its headers and its
JSON, and how slowly it can send it. Every bad input is a 4xx naming what was wrong, never a
500; nothing half-sent holds the server up for others. The API layer decides all of these:
in process, fake driver, both profiles (PostgreSQL is where out-of-range numbers used to end)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from tests.api.conftest import AUTH, Api
from tests.api.test_tenancy import bearer, new_key, new_org


@pytest.fixture
def driver_name() -> str:
    return "fake"


async def raw_request(api: Api, data: bytes, timeout: float = 10) -> bytes:
    """Bytes as sent, the answer's first line and headers back (whatever a client library allows)."""
    server = api.client.server
    reader, writer = await asyncio.open_connection(server.host, server.port)
    try:
        writer.write(data)
        await writer.drain()
        return await asyncio.wait_for(reader.read(4096), timeout)
    finally:
        writer.close()


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.") else 0


async def post(api: Api, path: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    resp = await api.client.post(path, data=body, headers={**AUTH, "Content-Type": "application/json",
                                                             **(headers or {})})
    return resp.status, await resp.json()


async def test_numbers_json_does_not_have_and_numbers_out_of_range_are_400s(api: Api) -> None:
    """``NaN``, ``Infinity`` (Python's json takes both), ``1e400`` (read as infinity) and
    integers past 64 bits (one of 5,000 digits is a ValueError in the decoder) were 500s or
    odd answers: ``"burst": 1e400`` and ``"rate": 1`` followed by 400 zeros were 500 on POST
    /keys, a 5,000-digit integer a 500 on every route, ``"rate": NaN`` "event does not
    survive serialisation". Each is now a 400 naming the body (or the field)."""
    await new_org(api, "alpha")
    admin = bearer((await new_key(api, "org_alpha", "admin"))["secret"])
    sid = (await api.data("POST", "/sandbox", json={}, expect=201))["sandboxId"]
    numbers = ["NaN", "Infinity", "-Infinity", "1e400", "-1e400", "1" + "0" * 400, "1" + "0" * 5000,
               str(2**63), str(-(2**63) - 1)]
    routes = [("/keys", '{"role": "member", "rate": %s}', admin), ("/keys", '{"role": "member", "burst": %s}', admin),
              ("/sandbox", '{"resources": {"cpu": %s}}', AUTH), ("/sandbox", '{"metadata": {"n": %s}}', AUTH),
              (f"/sandbox/{sid}/fork", '{"count": %s}', AUTH), (f"/sandbox/{sid}/execute", '{"command": ["true"], '
                                                                '"timeout": %s}', AUTH),
              ("/sandbox/snapshots/build", '{"runtime": "base:latest", "env": {"A": %s}}', AUTH)]
    for number in numbers:
        for path, template, headers in routes:
            status, answer = await post(api, path, (template % number).encode(), headers)
            assert status == 400 and answer["field"] == "body", (number[:20], path, status, answer)
    resp = await api.client.patch("/orgs/org_alpha/quota", data=b'{"memoryBytes": ' + str(10**23).encode() + b"}",
                                  headers={**AUTH, "Content-Type": "application/json"})
    assert resp.status == 400, await resp.text()
    assert (await api.data("GET", "/orgs/org_alpha"))["quota"]["memoryBytes"] is None
    # Inside the range, numbers are what they were (a key's rate and burst at their bounds,
    # 4c490bb: 1e300 a second made a bucket no clock can drain).
    made = await api.data("POST", "/keys", headers=admin, json={"role": "member", "rate": 1e6, "burst": 10**6},
                          expect=201)
    assert made["burst"] == 10**6


async def test_durations_sizes_and_cpus_past_any_machine_are_400s_naming_the_field(api: Api) -> None:
    """``expires: "99999999d"`` was a 500 (a date past the year 9999); ``cpu: "1e400"`` and a
    disk of ``99999999999999999999999999Ti`` reached the driver and failed there (DRIVER_ERROR,
    after throwing away warm sandboxes): each is a 400 naming the field."""
    await new_org(api, "alpha")
    admin = bearer((await new_key(api, "org_alpha", "admin"))["secret"])
    cases = [("POST", "/keys", {"role": "member", "expires": "99999999d"}, "expires", admin),
             ("POST", "/keys", {"role": "member", "expires": "99999999999999999999w"}, "expires", admin),
             ("POST", "/sandbox", {"resources": {"cpu": "1e400"}}, "resources.cpu", AUTH),
             ("POST", "/sandbox", {"resources": {"cpu": "100000000"}}, "resources.cpu", AUTH),
             ("POST", "/sandbox", {"resources": {"disk": "99999999999999999999999999Ti"}}, "resources.disk", AUTH),
             ("POST", "/sandbox", {"resources": {"memory": "9000000Ti"}}, "resources.memory", AUTH),
             ("POST", "/sandbox", {"resources": {"memory": 2**61}}, "resources.memory", AUTH)]
    for method, path, body, field, headers in cases:
        answer = await api.call(method, path, json=body, headers=headers, expect=400)
        assert answer["field"] == field, (body, answer)
    assert (await api.data("GET", "/sandbox"))["total"] == 0


async def test_names_with_a_trailing_newline_are_not_names(api: Api) -> None:
    """A project ``"web\\n"`` was made beside ``web`` (a regular expression's ``$`` matches
    before a final newline), and a snapshot named ``"asnap\\n"`` tagged ``"v1\\n"``: names
    that print as others do. Refused by name, like any other character a name cannot hold."""
    await new_org(api, "alpha")
    admin = bearer((await new_key(api, "org_alpha", "admin"))["secret"])
    sid = (await api.data("POST", "/sandbox", headers=admin, json={}, expect=201))["sandboxId"]
    cases = [("/projects", {"name": "web\n"}, "name", admin), ("/orgs", {"name": "alpha\n"}, "name", AUTH),
             (f"/sandbox/{sid}/snapshot", {"name": "asnap\n"}, "name", admin),
             (f"/sandbox/{sid}/snapshot", {"name": "asnap", "tag": "v1\n"}, "tag", admin)]
    for path, body, field, headers in cases:
        answer = await api.call("POST", path, json=body, headers=headers, expect=400)
        assert answer["field"] == field, (path, body, answer)
    assert (await api.data("GET", "/projects", headers=admin))["total"] == 0
    assert (await api.data("GET", "/sandbox/snapshots", headers=admin))["total"] == 0


async def test_request_lines_and_headers_that_smuggle_or_overflow_are_refused(api: Api) -> None:
    """Request smuggling and header abuse, sent byte for byte: both Content-Length and
    Transfer-Encoding, two Content-Lengths, a bad chunk size, an obsolete folded header, a
    NUL or bare CR in a header, a header of 100 KiB and 2,000 headers, a request line of
    100 KiB, a path with a NUL. Each is a 4xx (never a 500, never a second request read
    out of the first's body), and the connection is no use for anything more."""
    host = f"Host: {api.client.server.host}\r\n"
    auth = "Authorization: Bearer test-key\r\n"
    smuggled = "GET /keys HTTP/1.1\r\n" + host + auth + "\r\n"
    cases = [
        f"POST /sandbox HTTP/1.1\r\n{host}{auth}Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n"
        f"0\r\n\r\n{smuggled}",
        f"POST /sandbox HTTP/1.1\r\n{host}{auth}Content-Length: 2\r\nContent-Length: 40\r\n\r\n{{}}{smuggled}",
        f"POST /sandbox HTTP/1.1\r\n{host}{auth}Transfer-Encoding: chunked\r\n\r\nzz\r\n{{}}\r\n0\r\n\r\n",
        f"POST /sandbox HTTP/1.1\r\n{host}{auth}Transfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n",
        f"GET /sandbox HTTP/1.1\r\n{host}{auth}X-A: a\r\n b\r\n\r\n",
        f"GET /sandbox HTTP/1.1\r\n{host}{auth}X-A: a\x00b\r\n\r\n",
        f"GET /sandbox HTTP/1.1\r\n{host}{auth}X-A: a\rb\r\n\r\n",
        f"GET /sandbox HTTP/1.1\r\n{host}{auth}X-Big: {'a' * 100_000}\r\n\r\n",
        f"GET /sandbox HTTP/1.1\r\n{host}{auth}" + "".join(f"X-{i}: v\r\n" for i in range(2000)) + "\r\n",
        f"GET /sandbox?{'a' * 100_000} HTTP/1.1\r\n{host}{auth}\r\n",
        f"GET /sandbox/sbx_%00 HTTP/1.1\r\n{host}{auth}\r\n",
        f"GET /sandbox/../keys HTTP/1.1\r\n{host}{auth}\r\n",
    ]
    for request in cases:
        answer = await raw_request(api, request.encode())
        status = status_of(answer)
        assert 400 <= status < 500 or (status == 0 and answer == b""), (request[:120], answer[:200])
        assert answer.count(b"HTTP/1.1 ") <= 1, (request[:120], answer[:400])  # no second, smuggled answer
        assert b'"keys"' not in answer


async def test_half_sent_requests_do_not_hold_the_server_for_others(api: Api) -> None:
    """Slowloris: 100 connections that send half a request line and stop, and 100 that send a
    body's headers (Content-Length 1 MiB) and a few bytes of it, then stop. The server goes on
    answering everyone else at once; each of them holds a connection, nothing global."""
    server = api.client.server
    held: list[asyncio.StreamWriter] = []
    try:
        for i in range(200):
            _, writer = await asyncio.open_connection(server.host, server.port)
            if i % 2:
                writer.write(b"GET /sandbox HT")
            else:
                writer.write(b"POST /sandbox HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer test-key\r\n"
                             b"Content-Type: application/json\r\nContent-Length: 1048576\r\n\r\n{\"env\": {")
            await writer.drain()
            held.append(writer)
        await asyncio.sleep(0.5)
        started = time.monotonic()
        for _ in range(20):
            made = await api.data("POST", "/sandbox", json={}, expect=201)
            await api.data("GET", f"/sandbox/{made['sandboxId']}")
        assert time.monotonic() - started < 10
    finally:
        for writer in held:
            writer.close()
