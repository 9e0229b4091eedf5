"""The query parameters of E2B's wire, as E2B's documents declare them (e2b-dev/E2B
spec/openapi.yml for the control plane, spec/envd/envd.yaml for envd), checked before the
handler runs, the key or the sandbox (``checked_query``): a bad value is a 400 in E2B's shape
naming the parameter and what it takes, every value of a repeated one checked (the handler
reads the first; a proxy in front of hutch may read the last). The wire has no document of its
own (hutch's routes have api/route_schemas.py, checked by api/query_params.py), so its table is
here: every route of the wire has an entry, empty where it reads no query, and
tests/api/test_query_params.py refuses a route without one. What the types cannot say
(``nextToken`` a token this server gave, ``metadata`` pairs, ``path`` usable) the handlers check.

The handlers read the values with the parsers below, so the table cannot say one thing while a
route takes another."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from aiohttp import web
from aiohttp.typedefs import Handler

from hutch.api import query_params
from hutch.api.http import int_value, shown
from hutch.api.route_schemas import Param, Schema
from hutch.core.errors import InvalidInput

MAX_IDS = 100  # sandboxes in one GET /sandboxes/metrics, E2B's maxItems
STATES = ("running", "paused")
_TEXT: Schema = {"type": "string"}
_LIMIT: Schema = {"type": "integer", "minimum": 1, "maximum": 100}
# E2B's int64: past it E2B's server refuses a value, and so does hutch (not the year 10^30).
_INT64 = 2**63 - 1
_UNIX: Schema = {"type": "integer", "minimum": 0, "maximum": _INT64}  # Unix seconds
_DATE_TIME: Schema = {"type": "string", "format": "date-time"}
# An array is sent comma-joined (E2B's ``explode: false``), as both SDKs send it.
STATE = Param("state", {"type": "array", "items": {"type": "string", "enum": list(STATES)}})
SANDBOX_IDS = Param("sandbox_ids", {"type": "array", "items": _TEXT, "maxItems": MAX_IDS}, required=True)
START, END = Param("start", _UNIX), Param("end", _UNIX)
LIMIT = Param("limit", _LIMIT)
# envd's signed URLs (api/e2b/signed.py): the expiration may be past (then refused as expired).
EXPIRATION = Param("signature_expiration", {"type": "integer", "minimum": -_INT64 - 1, "maximum": _INT64})

_LISTING = (Param("metadata", _TEXT), STATE, Param("order", {"type": "string", "enum": ["asc", "desc"]}),
            Param("startedAfter", _DATE_TIME), Param("template", _TEXT), Param("nextToken", _TEXT),
            LIMIT)
_FILES = (Param("path", _TEXT), Param("username", _TEXT), Param("signature", _TEXT), EXPIRATION)
_NONE: tuple[Param, ...] = ()

QUERY: Mapping[tuple[str, str], tuple[Param, ...]] = {
    # control plane (api/e2b/control_routes.py, metrics.py, snapshot_routes.py)
    ("GET", "/sandboxes"): _LISTING,  # E2B's v1 takes metadata only; hutch serves both with one handler
    ("GET", "/v2/sandboxes"): _LISTING,
    ("POST", "/sandboxes"): _NONE,
    ("POST", "/v2/sandboxes"): _NONE,
    ("GET", "/sandboxes/{sandbox_id}"): _NONE,
    ("DELETE", "/sandboxes/{sandbox_id}"): _NONE,
    ("POST", "/sandboxes/{sandbox_id}/pause"): _NONE,
    ("POST", "/sandboxes/{sandbox_id}/resume"): _NONE,
    ("POST", "/sandboxes/{sandbox_id}/connect"): _NONE,
    ("POST", "/v2/sandboxes/{sandbox_id}/connect"): _NONE,
    ("POST", "/sandboxes/{sandbox_id}/timeout"): _NONE,
    ("PUT", "/sandboxes/{sandbox_id}/network"): _NONE,
    ("GET", "/sandboxes/{sandbox_id}/metrics"): (START, END),
    ("GET", "/sandboxes/metrics"): (SANDBOX_IDS,),
    ("POST", "/sandboxes/{sandbox_id}/snapshots"): _NONE,
    ("GET", "/snapshots"): (Param("sandboxID", _TEXT), Param("name", _TEXT), LIMIT, Param("nextToken", _TEXT)),
    ("DELETE", "/templates/{template_id}"): _NONE,
    ("POST", "/sandboxes/{sandbox_id}/fork"): _NONE,
    # envd (api/e2b/envd_routes.py, files_routes.py, watch_routes.py): Connect's calls take a body
    ("GET", "/health"): _NONE,
    ("GET", "/files"): _FILES,
    ("POST", "/files"): _FILES,
    **{("POST", f"/process.Process/{call}"): _NONE
       for call in ("Start", "Connect", "List", "SendSignal", "SendInput", "CloseStdin", "Update")},
    ("*", "/process.Process/{method}"): _NONE,
    **{("POST", f"/filesystem.Filesystem/{call}"): _NONE
       for call in ("Stat", "MakeDir", "ListDir", "Remove", "Move", "CreateWatcher", "GetWatcherEvents",
                    "RemoveWatcher", "WatchDir")},
    ("*", "/filesystem.Filesystem/{method}"): _NONE,
}


def integer(param: Param, raw: str) -> int:
    return int_value(param.name, raw, param.schema.get("minimum"), param.schema.get("maximum"))


def items(param: Param, raw: str) -> list[str]:
    """An array's values, comma-joined (empty ones dropped), each checked against its items."""
    values = [v.strip() for v in raw.split(",") if v.strip()]
    most = param.schema.get("maxItems")
    if most is not None and len(values) > most:
        raise InvalidInput(f"{param.name}: at most {most} at once, got {len(values)}", field=param.name)
    for value in values:
        query_params.check_value(Param(param.name, param.schema["items"]), value)
    return values


def datetime_value(name: str, raw: str) -> datetime:
    """An RFC 3339 time with its offset (the SDKs send one: Python's isoformat of an aware time)."""
    try:
        when = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError as err:
        raise InvalidInput(f"{name}: expected an ISO 8601 time, got {shown(raw)}", field=name) from err
    if when.tzinfo is None:
        raise InvalidInput(f"{name}: give the time zone too, got {shown(raw)}", field=name)
    return when


def check_value(param: Param, raw: str) -> None:
    if param.schema.get("type") == "array":
        items(param, raw)
    elif param.schema.get("format") == "date-time":
        datetime_value(param.name, raw)
    else:
        query_params.check_value(param, raw)


def declared(request: web.Request) -> tuple[Param, ...]:
    """The parameters the matched route declares (a HEAD is its GET's; a 404 declares none)."""
    route = request.match_info.route
    if route.resource is None:
        return ()
    return QUERY.get(("GET" if route.method == "HEAD" else route.method, route.resource.canonical), ())


@web.middleware
async def checked_query(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The declared parameters' every value, before the handler (and so its key, its sandbox).
    The last middleware: a request relayed to a sandbox's port (api/e2b/ports.py) never reaches
    here, and its query is the sandbox's own."""
    for param in declared(request):
        for raw in request.query.getall(param.name, []):
            if raw != "" or param.required:  # an empty value is the parameter left out, as on hutch's API
                check_value(param, raw)
    return await handler(request)
