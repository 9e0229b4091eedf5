"""Which fields a route's JSON body may carry, and the refusal of a field it does not take.

A field the server does not read is not an error a client sees: ``expiresAt`` where the field
is ``expires`` made a key that silently never expired. So, per route, from the request
schemas (api/wire_schemas.py, the one description of what the parsers read):

- hutch's own routes (organizations, projects, keys, quotas, SSH keys, fork, the Web App's
  sign-in) refuse every field they do not take, naming it (and the field meant, when one
  looks like it);
- the Agentuity wire's routes keep taking what clients send that hutch does not read —
  ``@agentuity/core`` 2.0.21's own fields (``CLIENT_SENDS``, read from its source) and
  whatever a later client adds — but refuse a field that looks like one they take (another
  spelling, a typo, a suffix such as ``expiresAt`` for ``expires``), naming the one meant.

Nested objects are checked the same way where the schema describes their fields
(``resources``, ``network``, ``timeout``, ``command``, each of ``files``). ``orgId`` is
every route's (the tenancy layer reads it).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from typing import Any

import attrs

from hutch.api.route_schemas import ROUTES
from hutch.api.wire_schemas import SCHEMAS, Schema
from hutch.core.errors import InvalidInput

# hutch's own routes: nothing but their fields.
HUTCH_ONLY = frozenset({
    ("POST", "/orgs"), ("PATCH", "/orgs/{org_id}/quota"), ("POST", "/projects"), ("POST", "/keys"),
    ("POST", "/ssh-keys"), ("POST", "/sandbox/{sandbox_id}/fork"), ("POST", "/app/session"),
    ("POST", "/nodes/{node}/drain"), ("PUT", "/sandbox/{sandbox_id}/network"),
})

# What @agentuity/core 2.0.21 (tests/compat/node_modules/@agentuity/core/src/services) sends
# that the request schemas leave out, because hutch reads it otherwise or not at all.
CLIENT_SENDS: dict[tuple[str, str], frozenset[str]] = {
    ("POST", "/sandbox"): frozenset({"scopes"}),  # refused by name when non-empty (no Agentuity services)
    ("POST", "/sandbox/sandboxes/{sandbox_id}/jobs"): frozenset({"streams"}),
    ("POST", "/sandbox/snapshots/build"): frozenset({"git"}),
    ("POST", "/sandbox/snapshots/{snapshot_id}/finalize"): frozenset({"sizeBytes", "fileCount", "files"}),
    ("POST", "/streams"): frozenset({"metadata", "headers", "ttl"}),
}
EVERY_ROUTE = frozenset({"orgId"})

# Endings that make another spelling of a field: expires/expiresAt, project/projectId, env/envs.
_SUFFIXES = ("at", "id", "ids", "s", "es", "name", "names", "ms", "seconds", "secs", "bytes")


@attrs.frozen
class Fields:
    """The fields an object takes (each with the fields of its own, if described)."""

    known: Mapping[str, Fields | None]
    strict: bool


def table() -> dict[tuple[str, str], Fields]:
    """Every route with a described JSON body: its fields."""
    out = {}
    for (method, path), op in ROUTES.items():
        schema = SCHEMAS.get(op.request or "")
        if schema is None or "properties" not in schema:
            continue
        fields = _fields(schema, method, path, top=True)
        if fields is not None:
            out[(method, path)] = fields
    return out


def _fields(schema: Schema, method: str, path: str, *, top: bool = False) -> Fields | None:
    schema = _unwrapped(schema)
    if "properties" not in schema:
        return None  # a map of free keys (env, metadata): no field names to check
    known: dict[str, Fields | None] = {name: _fields(_items(sub), method, path)
                                       for name, sub in schema["properties"].items()}
    if top:
        known.update(dict.fromkeys(EVERY_ROUTE | CLIENT_SENDS.get((method, path), frozenset())))
    return Fields(known=known, strict=(method, path) in HUTCH_ONLY)


def _unwrapped(schema: Schema) -> Schema:
    """An optional field's schema is ``anyOf: [it, null]``: the object inside, if any."""
    for option in schema.get("anyOf", ()):
        if option.get("type") in ("object", "array"):
            return dict(option)
    return schema


def _items(schema: Schema) -> Schema:
    schema = _unwrapped(schema)
    if schema.get("type") == "array" and isinstance(schema.get("items"), dict):
        return dict(schema["items"])
    return schema


def check(body: Mapping[str, Any], fields: Fields, route: str, at: str = "") -> None:
    """Refuse (400, naming it) the first field of ``body`` the route does not take."""
    for name, value in body.items():
        where = f"{at}.{name}" if at else name
        if name not in fields.known:
            meant = looks_like(name, fields.known)
            if meant is not None:
                raise InvalidInput(f"{where}: not a field of {route}; did you mean {meant}?", field=where)
            if fields.strict:
                raise InvalidInput(f"{where}: not a field of {route} (it takes {', '.join(sorted(fields.known))})",
                                   field=where)
            continue
        inner = fields.known[name]
        if inner is None:
            continue
        if isinstance(value, dict):
            check(value, inner, route, where)
        elif isinstance(value, list):
            for i, item in enumerate(value):
                if isinstance(item, dict):
                    check(item, inner, route, f"{where}[{i}]")


def looks_like(name: str, known: Mapping[str, object]) -> str | None:
    """The field ``name`` is most likely a spelling of, if any."""
    wanted = _norm(name)
    normal = {_norm(k): k for k in known}
    for norm, field in normal.items():
        if wanted == norm or any(a == b + end for a, b in ((wanted, norm), (norm, wanted)) for end in _SUFFIXES):
            return field
    for norm, field in normal.items():
        if min(len(wanted), len(norm)) >= 4 and _one_edit(wanted, norm):
            return field
    close = difflib.get_close_matches(wanted, list(normal), n=1, cutoff=0.8)
    return normal[close[0]] if close else None


def _one_edit(a: str, b: str) -> bool:
    """One letter changed, added, dropped, or two neighbours swapped (``idel`` for ``idle``)."""
    if abs(len(a) - len(b)) > 1:
        return False
    if len(a) == len(b):
        diff = [i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y]
        return len(diff) == 1 or (len(diff) == 2 and diff[1] == diff[0] + 1 and a[diff[0]] == b[diff[1]]
                                  and a[diff[1]] == b[diff[0]])
    short, long_ = sorted((a, b), key=len)
    return any(long_[:i] + long_[i + 1:] == short for i in range(len(long_)))


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())
