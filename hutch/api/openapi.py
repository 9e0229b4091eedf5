"""The API described: an OpenAPI 3.1 document made from the application's own route table, so
it cannot leave a route out (``GET /openapi.json``, no key needed).

Every route of the router becomes an operation: its path template and path parameters, its
summary (the handler's docstring), its tag (the routes module), whether it needs a key (the
tenancy layer's own ``access_of``: a route the API serves without one says ``security: []``).
JSON answers share one envelope (``{"success": …, "data" | "message", "code", "field"}``),
which the schema states and the fuzzing test (tests/api/test_openapi_fuzz.py) holds every
answer to; bodies are JSON objects unless the route takes bytes (uploads, stdin, archives).
Every operation states its request body, its success answer's ``data``, its media types and
its query parameters (with the handlers' limits) from api/route_schemas.py, and ``orgId``
where it needs a key; the schemas themselves are api/wire_schemas.py's. Streams, downloads,
server-sent events and websockets answer other media types, declared as such.
"""

from __future__ import annotations

import inspect
import re
from typing import Any

from aiohttp import web

from hutch.api.access import PUBLIC, access_of, needs
from hutch.api.http import base_url
from hutch.api.route_schemas import JSON, ROUTES, Op
from hutch.api.wire_schemas import EXAMPLES, SCHEMAS

VERSION = "3.1.0"

# The Agentuity CLI's calls hutch has no counterpart for: 501 NOT_SUPPORTED, by design.
_NOT_HERE = {"/cli/{tail}"}
_WEBSOCKETS = {"/sandbox/{sandbox_id}/terminal"}
_ANY = ["GET", "POST", "PUT", "PATCH", "DELETE"]
_PARAM = re.compile(r"\{([^}:]+)(?::[^}]*)?\}")
_ENVELOPE_REF = {"$ref": "#/components/schemas/Envelope"}
# This document itself is JSON but not in the envelope.
_DOCUMENT_OK = {"description": "this document", "content": {"application/json": {"schema": {
    "type": "object", "required": ["openapi", "paths"]}}}}

ENVELOPE: dict[str, Any] = {
    "type": "object",
    "required": ["success"],
    "properties": {
        "success": {"type": "boolean"},
        "data": {},
        "message": {"type": "string"},
        "code": {"type": "string"},
        "field": {},
    },
}


def _template(resource: web.AbstractResource) -> str | None:
    info = resource.get_info()
    if "path" in info:
        return str(info["path"])
    if "formatter" in info:
        return str(info["formatter"])
    if "prefix" in info:  # a static directory: one parameter for the file below it
        return str(info["prefix"]).rstrip("/") + "/{filename}"
    return None


def _pattern(resource: web.AbstractResource) -> dict[str, str]:
    """Path parameters with a pattern of their own ({ref:.+}): OpenAPI's ``pattern``."""
    raw = getattr(resource, "_formatter", None) and getattr(resource, "_pattern", None)
    out: dict[str, str] = {}
    if raw is not None:
        for name, rx in re.findall(r"\(\?P<([^>]+)>([^)]*)\)", raw.pattern):
            out[name] = rx
    return out


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _success(op: Op) -> dict[str, Any]:
    """The 2XX answer: the envelope, its ``data`` (and the fields beside it) as the route has them."""
    parts: list[dict[str, Any]] = [_ENVELOPE_REF]
    if op.data:
        parts.append({"required": ["data"], "properties": {"data": _ref(op.data)}})
    if op.top:
        parts.append(_ref(op.top))
    envelope = parts[0] if len(parts) == 1 else {"allOf": parts}
    content: dict[str, Any] = {JSON: {"schema": envelope}}
    if op.media != JSON:
        content = {op.media: {"schema": {}}, **content}
    return {"description": "success", "content": content}


def _parameters(path: str, resource: web.AbstractResource, op: Op, public: bool) -> list[dict[str, Any]]:
    patterns = _pattern(resource)
    params = [{"name": p, "in": "path", "required": True,
               "schema": {"type": "string", **({"pattern": f"^{patterns[p]}$"} if p in patterns else {})}}
              for p in _PARAM.findall(path)]
    for q in op.query:
        schema = q.schema
        if not q.required and schema.get("type") != "array" and set(schema) - {"type", "description"}:
            schema = {"anyOf": [schema, {"const": ""}]}  # an empty value is the parameter left out (api/http.py)
        param: dict[str, Any] = {"name": q.name, "in": "query", "required": q.required, "schema": schema}
        if q.description:
            param["description"] = q.description
        if q.schema.get("type") == "array":
            param["explode"] = True
        params.append(param)
    if not public:  # the tenancy layer reads it on every route that needs a key
        params.append({"name": "orgId", "in": "query", "required": False, "schema": {"type": "string"},
                       "description": "the organization to act for (the server's administrator: any)"})
    return params


def _request_body(op: Op) -> dict[str, Any] | None:
    if op.takes:
        return {"required": False, "content": {op.takes: {"schema": {}}}}
    if op.request:
        return {"required": op.required, "content": {JSON: {"schema": _ref(op.request),
                                                          "example": EXAMPLES[op.request]}}}
    return None


def _operation(method: str, path: str, handler: Any, resource: web.AbstractResource,
               ids: set[str]) -> dict[str, Any]:
    module = getattr(handler, "__module__", "api").rsplit(".", 1)[-1]
    name = getattr(handler, "__name__", "handler")
    op_id = f"{module}.{name}"
    while op_id in ids:
        op_id += "_" + method.lower()
    ids.add(op_id)
    doc = inspect.getdoc(handler) or ""
    summary = doc.split("\n\n")[0].replace("\n", " ").strip() or name.replace("_", " ")
    route = ROUTES.get((method, _PARAM.sub(lambda m: "{" + m.group(1) + "}", path)), Op())
    public = access_of(method, handler) == PUBLIC
    ok = _DOCUMENT_OK if path == "/openapi.json" else _success(route)
    op: dict[str, Any] = {
        "operationId": op_id,
        "summary": summary[:200],
        "tags": [module],
        "parameters": _parameters(path, resource, route, public),
        "responses": {
            "2XX": ok,
            "default": {"description": "an error: the envelope with success false, a message and a code",
                        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Envelope"}}}},
        },
    }
    if _PARAM.sub(lambda m: "{" + m.group(1) + "}", path) in _NOT_HERE:
        op["responses"]["501"] = {"description": "not something hutch has (NOT_SUPPORTED, naming the call)",
                                  "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Envelope"}}}}
    if path in _WEBSOCKETS:
        op["responses"]["101"] = {"description": "switching to the websocket (docs/wire.md)"}
    if public:
        op["security"] = []
    if (body := _request_body(route)) is not None:
        op["requestBody"] = body
    return op


def document(app: web.Application, *, server_url: str | None = None) -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    ids: set[str] = set()
    for route in app.router.routes():
        if route.method.upper() == "HEAD" or route.resource is None:
            continue
        path = _template(route.resource)
        if path is None:
            continue
        # "*" (the port proxy) takes any method: each one it would forward, described.
        methods = _ANY if route.method == "*" else [route.method.upper()]
        for method in methods:
            paths.setdefault(_PARAM.sub(lambda m: "{" + m.group(1) + "}", path), {})[method.lower()] = _operation(
                method, path, route.handler, route.resource, ids)
    doc: dict[str, Any] = {
        "openapi": VERSION,
        "info": {"title": "hutch", "version": "1",
                 "description": "Sandboxes for AI agents; wire-compatible with Agentuity's sandbox service."},
        "paths": dict(sorted(paths.items())),
        "components": {
            "schemas": {"Envelope": ENVELOPE, **SCHEMAS},
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer",
                                           "description": "an API key (hutch_…) or the server's bootstrap key"}},
        },
        "security": [{"bearer": []}],
    }
    if server_url:
        doc["servers"] = [{"url": server_url}]
    return doc


routes = web.RouteTableDef()


@routes.get("/openapi.json")
@needs(PUBLIC)  # a description of the API is no secret
async def openapi(request: web.Request) -> web.Response:
    """This document."""
    return web.json_response(document(request.app, server_url=base_url(request)))


__all__ = ["document", "routes"]
