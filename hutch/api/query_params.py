"""Every query parameter a route declares (api/route_schemas.py, the same table /openapi.json is
made from) is checked against its description before the handler runs: a boolean, an integer
in its bounds, one of an enum, a duration. So a bad value is a 400 naming the parameter and what
it accepts on every route, and the document cannot say one thing while a route takes another
(before, a route that looked its sandbox up first answered a bad ``rows``, ``cols`` or audit
``follow`` with a 404, and integers took " 5", "+5" and "1_0"). It runs before the key is
checked, as ``check_query`` does: what it refuses depends only on the public document. The
handlers still read the values with api/http.py's ``q_*`` helpers, which use the same
per-kind parsers below."""

from __future__ import annotations

from aiohttp import web

from hutch.api.http import bool_value, choice_value, int_value
from hutch.api.route_schemas import ROUTES, Param
from hutch.api.wire_schemas import DURATION
from hutch.core.quantities import parse_duration


def check_declared(request: web.Request) -> None:
    resource = request.match_info.route.resource
    if resource is None:
        return
    op = ROUTES.get((request.method, resource.canonical))
    if op is None:
        return
    for param in op.query:
        for raw in request.query.getall(param.name, []):
            if raw != "" or param.required:  # an empty value is the parameter left out (api/openapi.py)
                check_value(param, raw)


def check_value(param: Param, raw: str) -> None:
    schema, name = param.schema, param.name
    if schema is DURATION:
        parse_duration(name, raw)
    elif "enum" in schema:
        choice_value(name, raw, tuple(str(v) for v in schema["enum"]))
    elif schema.get("type") == "boolean":
        bool_value(name, raw)
    elif schema.get("type") == "integer":
        int_value(name, raw, schema.get("minimum"), schema.get("maximum"))


__all__ = ["check_declared", "check_value"]
