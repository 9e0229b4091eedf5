"""Second adversarial pass, the Web App's session (api/webapp/): what a cookie lets do, and to
whom. The first pass took the cross-site cases (tests/adversarial/test_origins.py); this one
mixes sessions and keys of two organizations and of a project-limited key, odd tokens, and the
terminal's websocket. In process, both profiles: the session layer is the API's."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest

from tests.api.conftest import Api
from tests.api.test_tenancy import bearer, new_key, new_org


@pytest.fixture
def driver_name() -> str:
    return "fake"


async def session_of(api: Api, secret: str) -> tuple[aiohttp.ClientSession, str]:
    """A browser of its own (its own cookie jar), signed in with ``secret``: (it, its CSRF token)."""
    browser = aiohttp.ClientSession(api.client.make_url("/"), cookie_jar=aiohttp.CookieJar(unsafe=True))
    resp = await browser.post("/app/session", json={"apiKey": secret})
    assert resp.status == 201, await resp.text()
    return browser, (await resp.json())["data"]["csrf"]


async def status(resp: Any) -> tuple[int, str]:
    body = await resp.json()
    return resp.status, body.get("code", "")


async def test_a_session_is_its_keys_and_only_its_keys(api: Api) -> None:
    """Two signed-in browsers, alpha's admin and beta's read-only key. Beta's browser with
    alpha's CSRF token, a CSRF token that is not ASCII (a 500 before), a read-only session
    with its right token writing, a bad bearer key beside a good cookie (no fall back to the
    cookie), and a cookie from a browser that signed out: each refused; the controls work."""
    await new_org(api, "alpha")
    await new_org(api, "beta")
    alpha_key = (await new_key(api, "org_alpha", "admin"))["secret"]
    beta_ro = (await new_key(api, "org_beta", "read-only"))["secret"]
    alpha, alpha_csrf = await session_of(api, alpha_key)
    beta, beta_csrf = await session_of(api, beta_ro)
    try:
        for token in (alpha_csrf, "\u00e9" * 40, "", alpha_csrf.upper()):
            resp = await beta.post("/sandbox", json={}, headers={"X-CSRF-Token": token})
            assert await status(resp) == (403, "FORBIDDEN"), token
        resp = await beta.post("/sandbox", json={}, headers={"X-CSRF-Token": beta_csrf})
        answer = await resp.json()
        assert resp.status == 403 and "read-only" in answer["message"], answer  # its role, not its token
        # A bad key beside a good cookie is a bad key: the header is what the request says it is.
        resp = await alpha.get("/sandbox", headers={"Authorization": "Bearer hk_wrong"})
        assert await status(resp) == (401, "UNAUTHORIZED")
        # The cookie is alpha's organization's: beta's things are as unknown as nothing.
        beta_sbx = (await api.data("POST", "/sandbox?orgId=org_beta", json={}, expect=201))["sandboxId"]
        assert (await alpha.get(f"/sandbox/{beta_sbx}")).status == 404
        assert (await beta.get(f"/sandbox/{beta_sbx}")).status == 200
        # Signed out, the same cookie (copied before) opens nothing here.
        kept = {c.key: c.value for c in alpha.cookie_jar}
        assert (await alpha.delete("/app/session", headers={"X-CSRF-Token": alpha_csrf})).status == 200
        replay = await api.client.get("/sandbox", cookies=kept)
        assert await status(replay) == (401, "UNAUTHORIZED")
    finally:
        await alpha.close()
        await beta.close()


async def test_every_request_with_the_cookie_must_come_from_hutchs_own_origin(api: Api) -> None:
    """Reads too: a GET with the cookie from an opaque origin (a path-form page), a sibling
    site, a sandbox host or another site is refused, as changes are; the browser's own
    navigation (``Sec-Fetch-Site: none``) and same-origin requests are not."""
    browser, csrf = await session_of(api, "test-key")
    own = str(api.client.make_url("/")).rstrip("/")
    try:
        for headers in ({"Origin": "null"}, {"Origin": "http://evil.example"}, {"Sec-Fetch-Site": "same-site"},
                        {"Sec-Fetch-Site": "cross-site"}, {"Origin": own.replace("127.0.0.1", "localhost")},
                        {"Origin": own + ".evil.example"}, {"Origin": "http://127.0.0.1"}):
            for method in ("GET", "POST", "DELETE"):
                path = "/app/session" if method != "POST" else "/sandbox"
                resp = await browser.request(method, path, json={} if method == "POST" else None,
                                             headers={**headers, "X-CSRF-Token": csrf})
                assert await status(resp) == (403, "FORBIDDEN"), (method, headers)
        for headers in ({"Sec-Fetch-Site": "none"}, {"Sec-Fetch-Site": "same-origin", "Origin": own}, {}):
            assert (await browser.get("/app/session", headers=headers)).status == 200, headers
    finally:
        await browser.close()


async def test_a_project_limited_session_and_its_live_feed_see_its_project_only(api: Api) -> None:
    """A key limited to project ``web`` signed in to the Web App: its lists and its live feed
    show ``web``'s sandboxes only, never the organization's other projects'."""
    await new_org(api, "alpha")
    admin = bearer((await new_key(api, "org_alpha", "admin"))["secret"])
    for name in ("web", "ml"):
        await api.data("POST", "/projects", headers=admin, json={"name": name}, expect=201)
    web_key = (await api.data("POST", "/keys", headers=admin, json={"role": "member", "projects": ["web"]},
                              expect=201))["secret"]
    browser, _ = await session_of(api, web_key)
    try:
        live = await browser.get("/app/live")
        assert live.status == 200
        ml_sbx = (await api.data("POST", "/sandbox", headers=admin, json={"projectId": "ml"}, expect=201))["sandboxId"]
        web_sbx = (await api.data("POST", "/sandbox", headers=admin, json={"projectId": "web"},
                                  expect=201))["sandboxId"]
        seen: list[dict[str, Any]] = []
        async with asyncio.timeout(10):
            while not any(e["sandboxId"] == web_sbx for e in seen):
                line = (await live.content.readline()).decode()
                if line.startswith("data: "):
                    seen.append(json.loads(line[6:]))
        assert ml_sbx not in {e["sandboxId"] for e in seen}, seen
        live.close()
        listed = await (await browser.get("/sandbox")).json()
        assert [s["sandboxId"] for s in listed["data"]["sandboxes"]] == [web_sbx], listed
        assert (await browser.get(f"/sandbox/{ml_sbx}")).status == 404
    finally:
        await browser.close()


@pytest.mark.parametrize("driver_name", ["local"])
async def test_the_terminal_websocket_takes_the_session_from_hutchs_origin_only(api: Api) -> None:
    """The terminal is a GET that runs commands. With the session cookie it opens only from
    hutch's own origin, never from a sibling site or an opaque origin, and not for a
    read-only session; a control message that is not one is answered, not obeyed."""
    sid = (await api.data("POST", "/sandbox", json={"runtime": "base:latest"}, expect=201))["sandboxId"]
    browser, _ = await session_of(api, "test-key")
    own = str(api.client.make_url("/")).rstrip("/")
    try:
        for headers in ({"Origin": "null"}, {"Origin": "http://evil.example"}, {"Sec-Fetch-Site": "same-site"}):
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await browser.ws_connect(f"/sandbox/{sid}/terminal", headers=headers)
            assert refused.value.status == 403, headers
        ws = await browser.ws_connect(f"/sandbox/{sid}/terminal?command=cat", headers={"Origin": own})
        for control in ('{"type": "exec", "command": ["id"]}', '{"type": "resize", "rows": 99999, "cols": 1}',
                        '{"type": "resize", "rows": true, "cols": 1}', "[" * 100 + "]" * 100, "\u00e9"):
            await ws.send_str(control)
            answer = await asyncio.wait_for(ws.receive(), 10)
            assert answer.type is aiohttp.WSMsgType.TEXT and json.loads(answer.data)["type"] == "error", control
        await ws.send_bytes(b"still-here\n")
        echoed = b""
        async with asyncio.timeout(10):
            while b"still-here" not in echoed:
                msg = await ws.receive()
                if msg.type is aiohttp.WSMsgType.BINARY:
                    echoed += msg.data
        await ws.close()
    finally:
        await browser.close()
    await new_org(api, "ro")
    reader = (await new_key(api, "org_ro", "read-only"))["secret"]
    ro_sbx = (await api.data("POST", "/sandbox?orgId=org_ro", json={"runtime": "base:latest"}, expect=201))["sandboxId"]
    browser, _ = await session_of(api, reader)
    try:
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await browser.ws_connect(f"/sandbox/{ro_sbx}/terminal", headers={"Origin": own})
        assert refused.value.status == 403
    finally:
        await browser.close()
