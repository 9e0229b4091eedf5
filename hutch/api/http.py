"""HTTP helpers shared by the routes: the envelope, query parsing, JSON bodies, streamed answers."""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
import re
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from hutch.api.keys import BODY_CHECK, CONFIG, STILL_AUTHORIZED
from hutch.core import phases
from hutch.core.errors import InvalidInput, PayloadTooLarge
from hutch.core.quantities import parse_duration

log = logging.getLogger(__name__)


def ok(data: Any = None, *, http_status: int = 200, top: dict[str, Any] | None = None) -> web.Response:
    """The success envelope; ``top`` holds fields the client reads beside ``data``."""
    body: dict[str, Any] = {"success": True}
    if data is not None:
        body["data"] = data
    body.update(top or {})
    return web.json_response(body, status=http_status)


# How deep a body may nest. The deepest body hutch reads is a few levels (metadata is kept as
# given, so a little room for it); past this the decoder's recursion would be the limit, and
# a body nested as deep as the parser allows was a 500 (RecursionError) in every route.
MAX_DEPTH = 64


async def json_body(request: web.Request, *, required: bool = True) -> dict[str, Any]:
    with phases.span("body: read, parse and check"):
        return await _json_body(request, required)


async def _json_body(request: web.Request, required: bool) -> dict[str, Any]:
    raw = await request.read()
    if (still := request.get(STILL_AUTHORIZED)) is not None:
        still()  # the body may have taken as long as its sender liked: a key revoked meanwhile acts no more
    if not raw.strip():
        if required:
            raise InvalidInput("body: a JSON object is required", field="body")
        return {}
    body = parse_json(raw)
    if not isinstance(body, dict):
        raise InvalidInput("body: expected a JSON object", field="body")
    if (check := request.app.get(BODY_CHECK)) is not None:
        check(request, body)
    return body


# How many values a body may hold (array items and object members, nested ones too). Decoding
# costs the server's event loop per value, not per byte: 32 million numbers in a 62 MiB body
# (within the body cap) held it 20 s and more, every other tenant's requests waiting. The largest
# body hutch takes holds far fewer: argv at most 512 KiB, env 1,024 variables, metadata 1,024
# keys and items.
MAX_VALUES = 100_000
# A JSON string (skipped whole, escapes included) or a comma, which parts one value from the
# next: counted before decoding, stopping once past the bound. (Values nested one in another
# without commas are bounded by MAX_DEPTH.)
_TOKENS_BYTES = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|,')
_TOKENS_TEXT = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|,')


def _check_values(raw: bytes | str, field: str) -> None:
    if (raw.count(b",") if isinstance(raw, bytes) else raw.count(",")) < MAX_VALUES:
        return  # fewer commas in all, strings included: no need to tell them apart (a 64 MiB base64 string: 0.35 s)
    tokens = _TOKENS_BYTES.finditer(raw) if isinstance(raw, bytes) else _TOKENS_TEXT.finditer(raw)
    values = 1
    for token in tokens:
        if token.end() - token.start() == 1:  # a comma: a string is two characters at least
            values += 1
            if values > MAX_VALUES:
                raise PayloadTooLarge(f"{field}: more than {MAX_VALUES} values (array items and object "
                                      "members); send fewer", field=field)


# Integers a body may hold: what a 64-bit counter (and PostgreSQL's bigint) takes. Nothing hutch
# reads is larger; a larger one was a 500 wherever it met a float() or the database.
MAX_INT = 2**63 - 1


class _NotJson(ValueError):
    pass


def _number(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e400: read as infinity by Python, a number by nobody
        raise _NotJson(f"the number {text[:40]} is out of range")
    return value


def _integer(text: str) -> int:
    if len(text) > 20 or abs(value := int(text)) > MAX_INT:
        raise _NotJson(f"the integer {text[:40]}{'...' if len(text) > 40 else ''} is out of range "
                       f"(at most {MAX_INT})")
    return value


def _constant(name: str) -> Any:
    raise _NotJson(f"{name} is not a JSON value")


def parse_json(raw: bytes | str, field: str = "body") -> Any:
    """The one decoder for what clients send (bodies, the auth's orgId look, terminal control
    messages): JSON, at most ``MAX_DEPTH`` deep, no NUL or lone surrogate in any string, no
    ``NaN``/``Infinity`` (Python's extensions), no number out of range and at most
    ``MAX_VALUES`` values."""
    _check_values(raw, field)
    try:
        value = json.loads(raw, parse_float=_number, parse_int=_integer, parse_constant=_constant)
    except RecursionError:
        raise InvalidInput(f"{field}: nested deeper than {MAX_DEPTH} levels", field=field) from None
    except _NotJson as err:
        raise InvalidInput(f"{field}: invalid JSON ({err})", field=field) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise InvalidInput(f"{field}: invalid JSON ({err})", field=field) from err
    _check_text(value, field)
    return value


def _check_text(body: Any, field: str) -> None:
    """Refuse a NUL character or a lone surrogate (``\\ud800``) anywhere in a body, keys too:
    PostgreSQL's text and jsonb cannot hold them, so an event carrying one would stop the
    production profile's projections at it (found by the fuzzing, tests/api/test_openapi_fuzz.py).
    A loop, not recursion: a body nested as deep as the JSON parser allows is still checked."""
    todo: list[tuple[Any, str, int]] = [(body, "", 0)]
    while todo:
        value, at, depth = todo.pop()
        if isinstance(value, (dict, list)) and depth >= MAX_DEPTH:
            raise InvalidInput(f"{field}: nested deeper than {MAX_DEPTH} levels (at {at or 'the top'})", field=field)
        if isinstance(value, dict):
            for key, item in value.items():
                path = f"{at}.{key}" if at else key
                _check_string(key, path)
                todo.append((item, path, depth + 1))
        elif isinstance(value, list):
            todo.extend((item, f"{at}[{i}]", depth + 1) for i, item in enumerate(value))
        elif isinstance(value, str):
            _check_string(value, at)


def _check_string(text: str, at: str) -> None:
    if "\x00" in text:
        raise InvalidInput(f"{at}: contains a NUL character", field=at)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise InvalidInput(f"{at}: contains a lone UTF-16 surrogate, not a character", field=at) from err


def q_int(request: web.Request, name: str, default: int, *, lo: int = 0, hi: int | None = None) -> int:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    return int_value(name, raw, lo, hi)


def int_value(name: str, raw: str, lo: int | None = 0, hi: int | None = None) -> int:
    """Digits only (a leading - too): Python's int() also takes " 5", "+5" and "1_000", which no
    client sends. Past 30 digits the value is beyond every bound, and not made (int() of more
    than 4,300 digits raises): the digits are counted, and made, without their leading zeros
    (thousands of zeros before a 1 were a 500)."""
    if not _INTEGER.fullmatch(raw):
        raise InvalidInput(f"{name}: expected an integer, got {shown(raw)}", field=name)
    digits, sign = raw.lstrip("-").lstrip("0"), -1 if raw.startswith("-") else 1
    value = sign * (int(digits or "0") if len(digits) <= 30 else 10**30)
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        bound = (f"between {lo} and {hi}" if lo is not None and hi is not None
                 else f"at least {lo}" if lo is not None else f"at most {hi}")
        raise InvalidInput(f"{name}: must be {bound}, got {shown(raw)}", field=name)
    return value


_INTEGER = re.compile(r"-?[0-9]+")


def shown(raw: str) -> str:
    """A query value in a message: whole unless long (an answer need not echo kilobytes back)."""
    return repr(raw) if len(raw) <= 64 else f"{raw[:64]!r}... ({len(raw)} characters)"


# Offsets past this are refused: PostgreSQL's OFFSET is a bigint (a larger one was a 500 on the
# production profile, found by the fuzzing), and no list is anywhere near this long.
MAX_OFFSET = 10**9


def q_offset(request: web.Request) -> int:
    return q_int(request, "offset", 0, hi=MAX_OFFSET)


def q_instant(request: web.Request, name: str) -> str | None:
    """An ISO 8601 time, checked here: the usage sums parse it and would fail on anything else."""
    raw = request.query.get(name)
    if not raw:
        return None
    try:
        dt.datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError as err:
        raise InvalidInput(f"{name}: expected an ISO 8601 time such as 2026-04-01T00:00:00Z, got {raw!r}",
                           field=name) from err
    return raw


def check_query(request: web.Request) -> None:
    """Refuse a NUL or a lone surrogate in any query name or value, and in the path's ids, as in
    bodies (``_check_text``): PostgreSQL's text cannot hold them, so a NUL in a list's filter
    (found by the fuzzing) and in a sandbox id (``/sandbox/sbx_%00``) were 500s on the
    production profile. A port URL's own path (``tail``) is the sandbox's business."""
    for key, value in request.query.items():
        _check_string(key, key)
        _check_string(value, key)
    for key, value in request.match_info.items():
        if key != "tail":
            _check_string(value, key)


def q_bool(request: web.Request, name: str) -> bool | None:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return None
    return bool_value(name, raw)


# What the clients send: true/false (@agentuity/core, the E2B SDK, hutch's CLI), 1/0 (curl users,
# the node agent's own flags); yes/no was accepted before and is kept.
TRUE, FALSE = ("true", "1", "yes"), ("false", "0", "no")


def bool_value(name: str, raw: str) -> bool:
    if raw.lower() in TRUE:
        return True
    if raw.lower() in FALSE:
        return False
    raise InvalidInput(f"{name}: expected true or false (or 1 or 0), got {shown(raw)}", field=name)


def q_choice(request: web.Request, name: str, choices: tuple[str, ...], default: str | None = None) -> str | None:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    return choice_value(name, raw, choices)


def choice_value(name: str, raw: str, choices: tuple[str, ...]) -> str:
    if raw not in choices:
        raise InvalidInput(f"{name}: expected one of {', '.join(choices)}, got {shown(raw)}", field=name)
    return raw


def q_duration(request: web.Request, name: str) -> float:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return 0.0
    return parse_duration(name, raw)


def base_url(request: web.Request) -> str:
    """Stream URLs must be absolute; build them from the configured public URL or the request."""
    configured = request.app[CONFIG].public_url
    if configured:
        return configured.rstrip("/")
    return f"{request.scheme}://{request.host}"


async def stream(request: web.Request, chunks: AsyncIterator[bytes], content_type: str, *,
                 content_length: int | None = None, headers: dict[str, str] | None = None) -> web.StreamResponse:
    """Answer with ``chunks`` as they come, flat in memory (each write waits for the socket).

    The first chunk is pulled before answering, so an error raised on the way in (a missing
    file) is still a JSON 4xx. With ``content_length`` (a stored archive whose size is known)
    the answer says it; otherwise it is chunked. The source is closed however the answer ends.

    An error once the answer has begun cuts the connection (ConnectionResetError: aiohttp
    closes it, and the client sees a transfer cut short). Let through, the envelope
    middleware answered it with a JSON 500 written into the body already under way: a
    client waited on a chunk that never came (a 1 MiB read on the cluster, 120 s, 5 runs in 15).
    """
    try:
        first = await anext(chunks, b"")
        resp = web.StreamResponse(headers={"Content-Type": content_type, "Cache-Control": "no-store", **(headers or {})})
        if content_length is None:
            resp.enable_chunked_encoding()
        else:
            resp.content_length = content_length
        await resp.prepare(request)
        try:
            if first:
                await resp.write(first)
            async for chunk in chunks:
                await resp.write(chunk)
        except ConnectionResetError:
            raise
        except Exception as err:  # whatever it was, the answer cannot carry it now
            why = getattr(err, "message", None) or f"{type(err).__name__}: {err}"
            log.warning("%s %s: the answer was cut short after it began: %s", request.method, request.path, why)
            raise ConnectionResetError(f"the answer was cut short: {why}") from err
        await resp.write_eof()
    finally:  # a client gone mid-answer must not leave the source (a driver read, a blob) open
        aclose = getattr(chunks, "aclose", None)
        if aclose is not None:
            await aclose()
    return resp
