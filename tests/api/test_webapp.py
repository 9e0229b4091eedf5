"""The Web App's server side (api/webapp/): sessions instead of keys in the browser, CSRF,
the live event stream, and the static files."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
import yarl

from tests.api.conftest import KEY, WIRE, Api


@pytest.fixture(params=["fake"])
def driver_name(request: pytest.FixtureRequest) -> str:
    return str(request.param)  # the session layer is the same whatever runs the sandboxes


async def _sign_in(api: Api, key: str = KEY) -> str:
    resp = await api.client.post("/app/session", json={"apiKey": key})
    body = await resp.json()
    assert resp.status == 201, body
    cookie = resp.cookies["hutch_session"]
    assert cookie["httponly"] and cookie["samesite"] == "Strict" and cookie["path"] == "/"
    assert key not in cookie.value  # the key never goes to the browser
    return body["data"]["csrf"]


async def test_a_session_acts_with_the_keys_rights_and_changes_need_the_csrf_token(api: Api) -> None:
    assert (await api.client.get("/app/session")).status == 401
    bad = await api.client.post("/app/session", json={"apiKey": "wrong"})
    assert bad.status == 401 and "invalid API key" in (await bad.json())["message"]
    csrf = await _sign_in(api)
    me = await (await api.client.get("/app/session")).json()
    assert me["data"]["orgId"] == "org_local" and me["data"]["role"] == "admin"
    assert (await api.client.get("/sandbox")).status == 200  # the cookie alone reads
    refused = await api.client.post("/sandbox", json={"runtime": "base:latest"})
    assert refused.status == 403 and "X-CSRF-Token" in (await refused.json())["message"]
    made = await api.client.post("/sandbox", json={"runtime": "base:latest"}, headers={"X-CSRF-Token": csrf})
    assert made.status == 201
    assert (await api.client.delete("/app/session", headers={"X-CSRF-Token": csrf})).status == 200
    assert (await api.client.get("/sandbox")).status == 401  # signed out


async def test_a_revoked_key_ends_its_sessions_and_a_forged_cookie_is_refused(api: Api) -> None:
    await api.data("POST", "/orgs", json={"name": "web"}, expect=201)
    made = await api.data("POST", "/keys?orgId=org_web", json={"role": "read-only"}, expect=201)
    await _sign_in(api, made["secret"])
    assert (await api.client.get("/sandbox")).status == 200
    await api.call("DELETE", f"/keys/{made['id']}?orgId=org_web")
    gone = await api.client.get("/sandbox")
    assert gone.status == 401 and "revoked" in (await gone.json())["message"]
    api.client.session.cookie_jar.clear()
    forged = await api.client.get("/sandbox", cookies={"hutch_session": "eyJrIjoia2V5X3gifQ.00"})
    assert forged.status == 401


@pytest.mark.runs_on(*WIRE)  # refused at the upgrade
async def test_a_websocket_from_another_origin_may_not_use_the_session(api: Api) -> None:
    await _sign_in(api)
    sid = (await api.data("POST", "/sandbox", json={"runtime": "base:latest"}, expect=201))["sandboxId"]
    with pytest.raises(aiohttp.WSServerHandshakeError) as err:
        await api.client.ws_connect(f"/sandbox/{sid}/terminal", headers={"Origin": "https://evil.example"})
    assert err.value.status == 403


async def test_live_events_are_the_organizations_own(api: Api) -> None:
    await api.data("POST", "/orgs", json={"name": "web"}, expect=201)
    made = await api.data("POST", "/keys?orgId=org_web", json={"role": "member"}, expect=201)
    await _sign_in(api, made["secret"])
    resp = await api.client.get("/app/live")
    assert resp.headers["Content-Type"].startswith("text/event-stream")
    await api.data("POST", "/sandbox", json={"runtime": "base:latest"}, expect=201)  # org_local's: not shown
    mine = await api.data("POST", "/sandbox", json={"runtime": "base:latest"}, expect=201,
                          headers={"Authorization": f"Bearer {made['secret']}"})
    seen = []
    async with asyncio.timeout(10):
        while not any(e["sandboxId"] == mine["sandboxId"] for e in seen):
            line = (await resp.content.readline()).decode()
            if line.startswith("data: "):
                seen.append(json.loads(line[6:]))
    assert {e["sandboxId"] for e in seen} == {mine["sandboxId"]}
    resp.close()


@pytest.mark.runs_on(*WIRE)  # static files
async def test_static_files_and_their_headers(api: Api) -> None:
    root = await api.client.get("/", allow_redirects=False)  # a person opening the address: the app, not a 401
    assert root.status == 302 and root.headers["Location"] == "/app"
    page = await api.client.get("/app")
    assert page.status == 200 and "<title>hutch</title>" in await page.text()
    csp = page.headers["Content-Security-Policy"]
    assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp and "worker-src 'none'" in csp
    origin = str(api.client.make_url("/")).rstrip("/")
    assert f"script-src {origin}/app/static/;" in csp, csp  # not 'self': the path form's /proxy/… is on it
    js = await api.client.get("/app/static/app.js")
    assert js.status == 200 and js.headers["Content-Type"].startswith("text/javascript")
    assert (await api.client.get("/app/static/vendor/xterm.js")).status == 200
    for sneaky in ("../../app.py", "..%2F..%2Fapp.py", "vendor/../../__init__.py", "nope.js", "..", "vendor/.."):
        resp = await api.client.get(yarl.URL(f"/app/static/{sneaky}", encoded=True))
        assert resp.status in (400, 401, 404) and "import" not in await resp.text(), sneaky


async def test_what_a_session_reads_is_never_kept_in_the_browsers_cache(api: Api) -> None:
    """The Web App reads a sandbox's environment (tokens, often), its files and its commands'
    output with the session cookie. With no ``Cache-Control`` a browser keeps those answers
    in its disk cache, there after sign-out for whoever uses the machine next. Every answer
    to a session's request, and the sign-in's (its CSRF token), says ``no-store``."""
    resp = await api.client.post("/app/session", json={"apiKey": KEY})
    assert resp.status == 201 and "no-store" in resp.headers.get("Cache-Control", ""), resp.headers
    csrf = (await resp.json())["data"]["csrf"]
    made = await api.client.post("/sandbox", json={"runtime": "base:latest", "env": {"TOKEN": "s3cret"}},
                                 headers={"X-CSRF-Token": csrf})
    assert made.status == 201, await made.text()
    sid = (await made.json())["data"]["sandboxId"]
    for path in (f"/sandbox/{sid}", "/sandbox", "/app/session", "/keys", f"/sandbox/{sid}?includeDeleted=true"):
        resp = await api.client.get(path)
        assert resp.status == 200, (path, await resp.text())
        assert "no-store" in resp.headers.get("Cache-Control", ""), (path, dict(resp.headers))
