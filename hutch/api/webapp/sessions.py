"""Web App sessions: a signed cookie instead of a key in the browser, and CSRF protection.

The cookie (HttpOnly, SameSite=Strict, Secure over TLS) holds the key's *id*, an expiry and a
nonce, signed with the server's secret: nothing to steal that works elsewhere, and every
request looks the key up again, so revoking the key ends its sessions at once. Requests
that change anything must also send ``X-CSRF-Token``: a second MAC of the cookie that the
page reads (from the sign-in answer or the readable ``hutch_csrf`` cookie) and another
site cannot. Every request made with the cookie (a websocket too), and signing in, must come
from this server's own origin when the browser says where it comes from (``Origin``,
``Sec-Fetch-Site``): a page of another site, of a sandbox host on this site, or of the path
form's opaque origin (``api/proxy_origin.py``) is refused, whatever cookie and token it holds.
Sign-out forgets the nonce in this process (other replicas keep honouring the cookie until
it expires: sessions last ``ttl``).

The cookies are host-only (no ``Domain``). When the browser reaches this server over TLS
(directly, or through a front ending TLS at ``HUTCH_PUBLIC_URL``'s host) they are named
``__Host-…``: a browser then refuses such a cookie from anyone but this host, so a page on a
sibling host (a sandbox's, under ``HUTCH_SANDBOX_DOMAIN``) cannot plant its own session here
(cookie tossing), and only those names are read. Over plain HTTP no name can say that.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import json
import secrets
import time
import urllib.parse

from aiohttp import web

from hutch.api.keys import CONFIG
from hutch.core.errors import Forbidden, Unauthorized
from hutch.core.tenancy import secrets_match

COOKIE = "hutch_session"
CSRF_COOKIE = "hutch_csrf"
HOST_ONLY = "__Host-"  # the browser's own guarantee that a cookie was set by this host, for this host
HUTCH_COOKIES = frozenset({COOKIE, CSRF_COOKIE, HOST_ONLY + COOKIE, HOST_ONLY + CSRF_COOKIE})
CSRF_HEADER = "X-CSRF-Token"
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
_SAME_ORIGIN = ("same-origin", "none")  # Sec-Fetch-Site: this origin's own pages, or the user (a bookmark)


def tls_browser(request: web.Request) -> bool:
    """The browser talks TLS: to this server, or to a front that ends it at the public URL's host."""
    if request.secure:
        return True
    public = request.app[CONFIG].public_url
    if not public:
        return False
    parts = urllib.parse.urlsplit(public)
    return parts.scheme == "https" and _authority(parts.netloc, 443) == _authority(request.host, 443)


def _authority(host: str, default_port: int) -> str:
    host = host.lower()
    return host.removesuffix(f":{default_port}")


def cookie_names(request: web.Request) -> tuple[str, str]:
    """(session cookie, CSRF cookie) as this request's browser keeps them."""
    prefix = HOST_ONLY if tls_browser(request) else ""
    return prefix + COOKIE, prefix + CSRF_COOKIE


def session_cookie(request: web.Request) -> str | None:
    return request.cookies.get(cookie_names(request)[0]) or None


def require_same_origin(request: web.Request, what: str) -> None:
    """Refuse a request a browser says comes from another origin. A client that is no
    browser sends neither header, and no other site can make it send anything. This
    server's origin is the request's Host, or ``HUTCH_PUBLIC_URL``'s (a front that rewrites
    Host)."""
    why = None
    site = request.headers.get("Sec-Fetch-Site")
    if site is not None and site.lower() not in _SAME_ORIGIN:
        why = f"Sec-Fetch-Site: {site}"
    origin = request.headers.get("Origin")
    if origin is not None:
        scheme, sep, authority = origin.lower().partition("://")
        default = 443 if scheme == "https" else 80
        # Any scheme on the request's own host: a front may end TLS before the request gets here.
        same = _authority(authority, default) == _authority(request.host, default)
        if public := request.app[CONFIG].public_url:
            parts = urllib.parse.urlsplit(public)
            same = same or (scheme == parts.scheme and _authority(authority, default) == _authority(parts.netloc, default))
        if not sep or scheme not in ("http", "https") or not same:
            why = f"Origin: {origin}"
    if why is not None:
        raise Forbidden(f"{what}: refused from another origin ({why}); the Origin must be this server's own "
                        f"({request.host}): sign in and use the Web App here")


class Sessions:
    def __init__(self, secret: bytes, ttl: float = 12 * 3600) -> None:
        self._secret = hashlib.sha256(b"hutch web app sessions\0" + secret).digest()
        self.ttl = ttl
        self._ended: set[str] = set()

    def _mac(self, text: str) -> str:
        return hmac.new(self._secret, text.encode(), hashlib.sha256).hexdigest()

    def issue(self, key_id: str) -> tuple[str, str]:
        """(the cookie, its CSRF token)."""
        body = base64.urlsafe_b64encode(json.dumps(
            {"k": key_id, "e": int(time.time() + self.ttl), "n": secrets.token_hex(8)}).encode()).decode()
        cookie = f"{body}.{self._mac(body)}"
        return cookie, self.csrf(cookie)

    def csrf(self, cookie: str) -> str:
        return self._mac("csrf:" + cookie)[:40]

    def key_id(self, cookie: str) -> str:
        body, _, mac = cookie.partition(".")
        if not body.isascii() or not secrets_match(mac, self._mac(body)):
            raise Unauthorized("the session cookie is not this server's; sign in again")
        try:
            data = json.loads(base64.urlsafe_b64decode(body))
            expires, nonce = float(data["e"]), str(data["n"])
        except (ValueError, KeyError, TypeError):
            raise Unauthorized("the session cookie is damaged; sign in again") from None
        if expires < time.time() or nonce in self._ended:
            raise Unauthorized("the session has ended; sign in again")
        return str(data["k"])

    def ends_at(self, cookie: str) -> str:
        """When the session ends (ISO-8601 UTC); ``Unauthorized`` if it has (expired or signed out)."""
        self.key_id(cookie)
        body = cookie.partition(".")[0]
        expires = float(json.loads(base64.urlsafe_b64decode(body))["e"])
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(expires))

    def end(self, cookie: str) -> None:
        body = cookie.partition(".")[0]
        with contextlib.suppress(ValueError, KeyError, TypeError):
            self._ended.add(json.loads(base64.urlsafe_b64decode(body))["n"])

    def check(self, request: web.Request, cookie: str) -> str:
        """The key id a cookie-authenticated request acts as, after the origin and CSRF checks."""
        key_id = self.key_id(cookie)
        websocket = request.headers.get("Upgrade", "").lower() == "websocket"
        require_same_origin(request, f"{'a websocket' if websocket else request.method} with this server's session")
        if request.method not in SAFE_METHODS:
            sent = request.headers.get(CSRF_HEADER, "")
            if not secrets_match(sent, self.csrf(cookie)):
                raise Forbidden(f"missing or wrong {CSRF_HEADER} header (the app sends it on every change)")
        return key_id


SESSIONS: web.AppKey[Sessions] = web.AppKey("sessions", Sessions)
