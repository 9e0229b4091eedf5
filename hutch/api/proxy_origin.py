"""What crosses the port proxy (``routes/proxy.py``), by the origin a port is served on.

A sandbox's port has two URL forms, and they are different origins:

- **the host form**, ``{port}-{id}.{HUTCH_SANDBOX_DOMAIN}``: the sandbox's own origin. Its
  cookies are its own and pass both ways, but hutch's cookies (``HUTCH_COOKIES``) never reach
  it, and a cookie its answer sets stays on its own host: the ``Domain`` attribute, which
  would plant it on hutch's host or on other sandboxes' hosts under the same parent, is
  taken off.
- **the path form**, ``/proxy/{id}/…``: hutch's own origin, the API's and the Web App's. Every
  cookie the browser sends there is hutch's (or one planted on hutch's origin), so none is
  passed on; its answer keeps only headers that act on that one response or document
  (``_PER_RESPONSE``): no ``Set-Cookie``, ``Service-Worker-Allowed``, ``Clear-Site-Data``,
  ``NEL``/``Report-To``, ``Alt-Svc``, ``Strict-Transport-Security``, ``Set-Login``,
  ``Refresh``, ``Link``, ``WWW-Authenticate`` or anything else that would act on the origin.
  Every answer carries ``Content-Security-Policy: sandbox …`` without ``allow-same-origin``
  (``PATH_FORM_CSP``, added to the sandbox's own policies, which still hold: a browser
  enforces every policy it is given), so the document runs in an opaque origin: it cannot
  read hutch's cookies or storage, its requests to hutch carry no cookie, it can register no
  service worker, and nothing it answers is read as another type (``nosniff``). Its
  requests back to the sandbox are cross-origin, so answers are readable by any origin
  (``Access-Control-Allow-Origin: *`` unless the sandbox says otherwise): the URL is public
  and carries no credential, so nothing is shared that a bare request would not get.
"""

from __future__ import annotations

from collections.abc import Iterable

from hutch.api.webapp.sessions import CSRF_HEADER, HUTCH_COOKIES

# No allow-same-origin (the point), no allow-top-navigation* (it is the top document), no
# allow-popups-to-escape-sandbox (a popup stays as opaque as its opener).
PATH_FORM_CSP = ("sandbox allow-scripts allow-forms allow-popups allow-modals allow-downloads "
                 "allow-pointer-lock allow-presentation allow-orientation-lock")
# Headers of an answer that act on that response or its document alone, never on the origin.
_PER_RESPONSE = frozenset({
    "accept-ranges", "age", "allow", "cache-control", "content-disposition", "content-encoding",
    "content-language", "content-location", "content-range", "content-security-policy",
    "content-security-policy-report-only", "content-type", "cross-origin-embedder-policy",
    "cross-origin-opener-policy", "cross-origin-resource-policy", "date", "document-policy", "etag", "expires",
    "last-modified", "location", "permissions-policy", "pragma", "referrer-policy", "retry-after", "server",
    "timing-allow-origin", "vary",
})
_PER_RESPONSE_PREFIXES = ("access-control-", "x-")


def request_headers(headers: Iterable[tuple[str, str]], *, path_form: bool) -> list[tuple[str, str]]:
    """The browser's request headers as the sandbox may see them: no hutch cookie, no CSRF token."""
    out: list[tuple[str, str]] = []
    for name, value in headers:
        low = name.lower()
        if low == CSRF_HEADER.lower():
            continue
        if low == "cookie":
            if path_form:
                continue  # every cookie of hutch's origin is hutch's to keep
            value = _without_hutch_cookies(value)
            if not value:
                continue
        out.append((name, value))
    return out


def _without_hutch_cookies(header: str) -> str:
    kept = [c.strip() for c in header.split(";")]
    return "; ".join(c for c in kept if c and c.partition("=")[0].strip() not in HUTCH_COOKIES)


def answer_headers(headers: Iterable[tuple[str, str]], *, path_form: bool) -> list[tuple[str, str]]:
    """The sandbox's answer headers (hop-by-hop ones already gone) as the browser may see them."""
    if not path_form:
        return [(name, _host_only(value) if name.lower() == "set-cookie" else value) for name, value in headers]
    out = [(name, value) for name, value in headers if _per_response(name.lower())]
    out += [("Content-Security-Policy", PATH_FORM_CSP), ("X-Content-Type-Options", "nosniff")]
    if not any(name.lower() == "access-control-allow-origin" for name, _ in out):
        out.append(("Access-Control-Allow-Origin", "*"))
    return out


def _per_response(low: str) -> bool:
    if low == "x-content-type-options":
        return False  # ours is nosniff, whatever the sandbox asked
    return low in _PER_RESPONSE or low.startswith(_PER_RESPONSE_PREFIXES)


def _host_only(set_cookie: str) -> str:
    """``Set-Cookie`` without its ``Domain`` attribute: the cookie stays on the host that set it."""
    parts = set_cookie.split(";")
    return ";".join([parts[0], *(p for p in parts[1:] if p.strip().partition("=")[0].strip().lower() != "domain")])

