"""Issue 32, the port proxy's origin: no content a sandbox serves can ever act with a hutch
credential. A hostile tenant serves ``origin_site.SITE`` on its sandbox's port and waits for
a signed-in admin of another organization to open it (a link in a chat, an image tag, a
redirect). The attacks: hutch's cookies replayed from the request the sandbox sees; cookies,
service workers and origin-wide policies set by its answer; its page's JavaScript reading
the Web App and minting keys with the visitor's session (the path form shares hutch's
origin); cookies planted from a sandbox host under the same site, login CSRF, the API
answering on sandbox hosts, and the proxy as an oracle of which sandbox ids exist.

The in-process tests here speak HTTP as curl would; ``test_origins_browser.py`` runs the
same attacks in Chromium."""

from __future__ import annotations

import asyncio
import base64
import json
import re
import secrets
import string
from typing import Any

import pytest

from tests.adversarial.origin_site import PORT, SITE
from tests.api.conftest import AUTH, Api

DOMAIN = "sandboxes.test"
HUTCH_COOKIES = "theirs=1; hutch_session=S; hutch_csrf=C; __Host-hutch_session=S2; __Host-hutch_csrf=C2; other=2"
# What a header that acts beyond one document would do on hutch's origin, were it passed on.
ORIGIN_WIDE = ("set-cookie", "service-worker-allowed", "clear-site-data", "set-login", "nel", "report-to",
               "reporting-endpoints", "strict-transport-security", "alt-svc", "origin-agent-cluster", "accept-ch",
               "critical-ch", "sec-session-registration", "link", "refresh", "www-authenticate")


@pytest.fixture(params=["local"])
def driver_name(request: pytest.FixtureRequest) -> str:
    return str(request.param)  # the proxy's rules are the API's; test_ports.py covers nomad's ports


async def _site(api: Api, *, headers: dict[str, str] | None = None) -> str:
    """A sandbox (of the key's organization) serving the hostile site on its port."""
    sid = (await api.data("POST", "/sandbox", json={"runtime": "python:3.13", "network": {"port": PORT}},
                          expect=201, headers=headers or {}))["sandboxId"]
    files = [{"path": "site.py", "content": base64.b64encode(SITE.encode()).decode()}]
    await api.call("POST", f"/fs/{sid}", json={"files": files}, headers=headers or {})
    await api.call("POST", f"/sandbox/sandboxes/{sid}/jobs", json={"command": ["python3", "site.py"]}, expect=201,
                   headers=headers or {})
    for _ in range(150):
        resp = await api.client.get(f"/proxy/{sid}/echo")
        if resp.status == 200:
            return sid
        await asyncio.sleep(0.1)
    raise AssertionError(f"the site did not come up: {resp.status} {await resp.text()}")


def _host(sid: str, port: int = PORT) -> str:
    return f"{port}-{sid.removeprefix('sbx_')}.{DOMAIN}"


async def _echo(api: Api, path: str, **headers: str) -> dict[str, str]:
    resp = await api.client.get(path, headers={"Cookie": HUTCH_COOKIES, **headers})
    assert resp.status == 200, await resp.text()
    return dict(await resp.json())


async def _ws_echo(api: Api, path: str, **headers: str) -> dict[str, str]:
    ws = await api.client.ws_connect(path, headers={"Cookie": HUTCH_COOKIES, **headers})
    try:
        return dict(json.loads((await ws.receive(timeout=10)).data))
    finally:
        await ws.close()


async def test_no_hutch_cookie_reaches_a_sandbox_and_its_answer_acts_on_no_origin(make_api) -> None:  # type: ignore[no-untyped-def]
    """The header-echo attack of the issue, and the hostile answer, on both URL forms."""
    api = await make_api(sandbox_domain=DOMAIN)
    sid = await _site(api)
    host = _host(sid)

    # The path form is hutch's origin: every cookie the browser sends there is hutch's (its
    # own, or one planted on the origin), so none passes, over HTTP or a websocket.
    assert "cookie" not in await _echo(api, f"/proxy/{sid}/echo")
    assert "cookie" not in await _ws_echo(api, f"/proxy/{sid}/ws")
    # The host form is the sandbox's own origin: its own cookies pass, never hutch's.
    assert (await _echo(api, "/echo", Host=host))["cookie"] == "theirs=1; other=2"
    assert (await _ws_echo(api, "/ws", Host=host))["cookie"] == "theirs=1; other=2"
    # Nor the Web App's CSRF token, were a page to send it along.
    assert "x-csrf-token" not in await _echo(api, f"/proxy/{sid}/echo", **{"X-CSRF-Token": "C"})

    # The path form's answer: an opaque-origin document that can set nothing on hutch's origin.
    resp = await api.client.get(f"/proxy/{sid}/evil-headers")
    assert resp.status == 200 and await resp.text() == "<p>hello</p>"
    passed = {name.lower() for name in resp.headers}
    assert not passed & set(ORIGIN_WIDE), sorted(passed & set(ORIGIN_WIDE))
    assert resp.headers["X-App-Header"] == "kept"
    policies = resp.headers.getall("Content-Security-Policy")
    ours = [p for p in policies if "allow-same-origin" not in p]
    assert ours and re.match(r"sandbox( allow-[a-z-]+)*(;|$)", ours[0]), policies
    assert "sandbox allow-same-origin allow-scripts" in policies  # the sandbox's own, kept: both hold
    assert resp.headers.getall("X-Content-Type-Options") == ["nosniff"]
    # Its own requests (images, module scripts, fetch) come from the opaque origin: cross-origin.
    assert resp.headers["Access-Control-Allow-Origin"] == "*"
    # Every answer of the path form is served so, whatever its type.
    resp = await api.client.get(f"/proxy/{sid}/echo")
    assert resp.headers["Content-Security-Policy"].startswith("sandbox")

    # The host form's cookies stay on the sandbox's own host: a Domain attribute (which would
    # plant them on every sibling host under the domain, or on hutch's own) is taken off.
    resp = await api.client.get("/domain-cookie", headers={"Host": host})
    cookies = resp.headers.getall("Set-Cookie")
    assert len(cookies) == 3 and not any("domain" in c.lower() for c in cookies), cookies
    assert cookies[0] == "theirs=1; Path=/; HttpOnly"


async def test_the_api_and_the_web_app_do_not_answer_on_sandbox_hosts(make_api) -> None:  # type: ignore[no-untyped-def]
    """A host under the sandbox domain is a sandbox's origin (or nothing): never hutch's. Were
    the Web App served there, a sandbox host next to it could read it and plant its cookies."""
    api = await make_api(sandbox_domain=DOMAIN)
    sid = await _site(api)
    unknown = f"8000-{'0' * 26}.{DOMAIN}"
    for host in (f"www.{DOMAIN}", f"WWW.{DOMAIN.upper()}", f"a.b.{DOMAIN}", f"app.{DOMAIN}:8700", unknown,
                 f"8000-{sid.removeprefix('sbx_')}x.{DOMAIN}", f"x.{_host(sid)}"):
        for path in ("/app", "/app/session", "/keys", "/sandbox", "/openapi.json", "/healthz"):
            resp = await api.client.get(path, headers={"Host": host, **AUTH})
            body = await resp.json()
            assert resp.status == 404 and body["code"] == "SANDBOX_NOT_FOUND", (host, path, resp.status, body)
        resp = await api.client.post("/app/session", json={"apiKey": "test-key"}, headers={"Host": host})
        assert resp.status == 404 and "Set-Cookie" not in resp.headers, (host, resp.status)
    # The sandbox's own host: its app, at every path (hutch's paths included).
    assert "cookie" not in await _echo(api, "/app/session", Host=_host(sid), Cookie="")
    # The API's own host still answers.
    assert (await api.data("GET", "/sandbox"))["sandboxes"]


def _shape(body: dict[str, Any], sid: str) -> dict[str, Any]:
    return {k: (v.replace(sid, "{id}").replace(sid.removeprefix("sbx_"), "{id}") if isinstance(v, str) else v)
            for k, v in body.items()}


async def test_a_port_url_tells_nothing_of_sandboxes_it_does_not_serve(make_api) -> None:  # type: ignore[no-untyped-def]
    """Unknown, another organization's without a port, paused without a port, ended: one 404,
    word for word, on both URL forms; and such a request wakes nothing."""
    api = await make_api(sandbox_domain=DOMAIN)
    await api.data("POST", "/orgs", json={"name": "beta"}, expect=201)
    beta = {"Authorization": "Bearer " + (await api.data("POST", "/keys?orgId=org_beta", json={"role": "admin"},
                                                         expect=201))["secret"]}
    no_port = (await api.data("POST", "/sandbox", json={"runtime": "base:latest"}, expect=201,
                              headers=beta))["sandboxId"]
    paused = (await api.data("POST", "/sandbox", json={"runtime": "base:latest"}, expect=201,
                             headers=beta))["sandboxId"]
    await api.call("POST", f"/sandbox/{paused}/pause", headers=beta)
    ended = await _site(api, headers=beta)
    served = await _site(api, headers=beta)
    await api.call("DELETE", f"/sandbox/{ended}", headers=beta)
    unknown = "sbx_" + "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(26))

    def path_form(sid: str) -> tuple[str, dict[str, str]]:
        return f"/proxy/{sid}/x", {}

    def host_form(sid: str, port: int = PORT) -> tuple[str, dict[str, str]]:
        return "/x", {"Host": _host(sid, port)}

    shapes = []
    for sid, (path, headers) in [(s, form(s)) for s in (unknown, no_port, paused, ended)
                                 for form in (path_form, host_form)] + [(served, host_form(served, 9000))]:
        for method in ("GET", "POST"):
            resp = await api.client.request(method, path, headers={**headers, **AUTH})
            body = await resp.json()
            shapes.append((resp.status, _shape(body, sid)))
    assert len(set(map(json.dumps, shapes))) == 1, shapes
    assert shapes[0][0] == 404
    assert (await api.data("GET", f"/sandbox/{paused}", headers=beta))["status"] == "paused"


async def test_sign_in_and_cookie_routes_refuse_cross_site_requests(make_api) -> None:  # type: ignore[no-untyped-def]
    """Login CSRF: a form on another site (or on a sandbox host of the same site) posting
    text/plain signs the visitor in as the attacker. Refused before any cookie is set."""
    api = await make_api(driver="fake", public_url="https://hutch.example.com")
    own = str(api.client.make_url("/")).rstrip("/")
    body = json.dumps({"apiKey": "test-key"})
    refused = [
        ({"Content-Type": "text/plain", "Origin": "http://evil.example"}, 403),
        ({"Content-Type": "application/json", "Origin": "http://evil.example"}, 403),
        ({"Content-Type": "application/json", "Origin": "null"}, 403),  # an opaque origin: a sandboxed page
        ({"Content-Type": "application/json", "Origin": f"http://8000-x.{DOMAIN}"}, 403),
        ({"Content-Type": "application/json", "Sec-Fetch-Site": "cross-site"}, 403),
        ({"Content-Type": "application/json", "Sec-Fetch-Site": "same-site"}, 403),  # a sibling host
        ({"Content-Type": "text/plain", "Origin": own}, 415),
        ({"Content-Type": "application/x-www-form-urlencoded"}, 415),
        ({}, 415),
    ]
    for headers, status in refused:
        resp = await api.client.post("/app/session", data=body, headers=headers)
        answer = await resp.json()
        assert resp.status == status and "Set-Cookie" not in resp.headers, (headers, resp.status, answer)
        assert ("Origin" if status == 403 else "Content-Type") in answer["message"], answer
    assert not api.client.session.cookie_jar.filter_cookies(api.client.make_url("/"))

    resp = await api.client.post("/app/session", data=body, headers={"Content-Type": "application/json",
                                                                     "Origin": own, "Sec-Fetch-Site": "same-origin"})
    assert resp.status == 201, await resp.text()
    csrf = (await resp.json())["data"]["csrf"]
    set_cookies = resp.headers.getall("Set-Cookie")
    assert len(set_cookies) == 2 and not any("domain" in c.lower() for c in set_cookies), set_cookies  # host-only
    # Every change made with the cookie checks the origin too, the CSRF token notwithstanding.
    for origin in ("http://evil.example", "null", f"http://8000-x.{DOMAIN}"):
        resp = await api.client.post("/sandbox", json={}, headers={"X-CSRF-Token": csrf, "Origin": origin})
        assert resp.status == 403 and "Origin" in (await resp.json())["message"], origin
        resp = await api.client.delete("/app/session", headers={"X-CSRF-Token": csrf, "Origin": origin})
        assert resp.status == 403, origin
    resp = await api.client.post("/sandbox", json={}, headers={"X-CSRF-Token": csrf, "Origin": own})
    assert resp.status == 201, await resp.text()
    # A client that is no browser (no Origin, no Sec-Fetch-Site) still signs in with JSON, and
    # so does a browser on HUTCH_PUBLIC_URL's origin behind a front that rewrites Host.
    for headers in ({}, {"Origin": "https://hutch.example.com", "Sec-Fetch-Site": "same-origin"}):
        api.client.session.cookie_jar.clear()
        resp = await api.client.post("/app/session", json={"apiKey": "test-key"}, headers=headers)
        assert resp.status == 201, (headers, await resp.text())
    resp = await api.client.post("/app/session", json={"apiKey": "test-key"},
                                 headers={"Origin": "http://hutch.example.com"})  # not its scheme's port
    assert resp.status == 403
