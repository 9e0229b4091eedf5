"""Connect RPC (connectrpc.com/docs/protocol) over aiohttp, the part envd's clients use: unary
calls (``application/proto`` or ``application/json``: the body is the message) and server
streams (``application/connect+proto`` or ``…connect+json``: the request and each answer in a
five-byte envelope, the stream closed by an end-of-stream envelope whose JSON carries the
error, if any). E2B's SDKs send JSON; other Connect clients default to protobuf
(api/e2b/codec.py reads and writes both).

Errors keep Connect's shapes: a unary call answers ``{"code": "not_found", "message": …}``
with the HTTP status Connect pairs with the code; a stream that already answered 200 ends with
``{"error": {"code", "message"}}``. hutch's own errors map by their HTTP status."""

from __future__ import annotations

import asyncio
import json
import os
import struct

import attrs
from aiohttp import web

from hutch.api.keys import STILL_AUTHORIZED
from hutch.core.errors import HutchError, InvalidInput, PayloadTooLarge, UnsupportedMediaType

UNARY = {"application/proto": False, "application/json": True}  # content type -> is JSON
STREAM = {"application/connect+proto": False, "application/connect+json": True}
_END_STREAM = 0x02
_COMPRESSED = 0x01
MAX_MESSAGE = 4 * 2**20  # envd's requests are small: a command line, a path, some stdin
def seconds_setting(name: str, default: float) -> float:
    """A bound of this wire an operator may change (tests shorten them to wait less)."""
    given = os.environ.get(name)
    if given is None:
        return default
    try:
        value = float(given)
    except ValueError:
        value = 0.0
    if not 0 < value <= 3600:
        raise ValueError(f"{name}={given!r}: expected seconds, more than 0 and at most 3600")
    return value


# a request message that stops arriving for this long never will
BODY_IDLE_SECONDS = seconds_setting("HUTCH_E2B_BODY_IDLE_SECONDS", 10.0)
BODY_SECONDS = 60.0  # nor one that trickles for longer: 4 MiB at 1 Mbit/s takes 34 s

# Connect's codes and the HTTP status each answers a unary call with.
_STATUS_OF_CODE = {"canceled": 499, "unknown": 500, "invalid_argument": 400, "deadline_exceeded": 504,
                   "not_found": 404, "already_exists": 409, "permission_denied": 403,
                   "resource_exhausted": 429, "failed_precondition": 400, "aborted": 409, "out_of_range": 400,
                   "unimplemented": 501, "internal": 500, "unavailable": 503, "data_loss": 500,
                   "unauthenticated": 401}
_CODE_OF_STATUS = {400: "invalid_argument", 401: "unauthenticated", 403: "permission_denied", 404: "not_found",
                   409: "failed_precondition", 413: "resource_exhausted", 415: "invalid_argument",
                   429: "resource_exhausted", 501: "unimplemented", 503: "unavailable", 504: "deadline_exceeded"}


class RpcError(Exception):
    """An error with a Connect code of its own (not one of hutch's by HTTP status)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


def code_of(err: BaseException) -> tuple[str, str]:
    if isinstance(err, RpcError):
        return err.code, err.message
    if isinstance(err, HutchError):
        return _CODE_OF_STATUS.get(err.status or 500, "internal"), err.message
    return "internal", "internal error; see the server log"


def error_response(err: BaseException) -> web.Response:
    code, message = code_of(err)
    return web.json_response({"code": code, "message": message}, status=_STATUS_OF_CODE[code])


def _check_encoding(request: web.Request) -> None:
    for header in ("Content-Encoding", "Connect-Content-Encoding"):
        value = request.headers.get(header, "identity").lower()
        if value != "identity":
            raise UnsupportedMediaType(f"{header}: {value!r} is not supported; send messages uncompressed")


async def _read_body(request: web.Request) -> bytes:
    """The whole body, however it arrives (in pieces, chunked), at most one message and its
    envelope long; one that stalls, or trickles for longer than a message ever takes, is refused
    rather than held open (``StreamReader.read(n)`` answers what has come so far, not ``n``)."""
    limit = MAX_MESSAGE + 5
    if request.content_length is not None and request.content_length > limit:
        raise PayloadTooLarge(f"body: larger than the {MAX_MESSAGE} bytes a message may be")
    body = bytearray()
    try:
        async with asyncio.timeout(BODY_SECONDS):
            while True:
                async with asyncio.timeout(BODY_IDLE_SECONDS):
                    chunk = await request.content.read(limit + 1 - len(body))
                if not chunk:
                    return bytes(body)
                body += chunk
                if len(body) > limit:
                    raise PayloadTooLarge(f"body: larger than the {MAX_MESSAGE} bytes a message may be")
    except TimeoutError:
        raise RpcError("invalid_argument", f"body: the request message did not arrive whole ({len(body)} bytes "
                       f"came; nothing for {BODY_IDLE_SECONDS:g} s or not all within {BODY_SECONDS:g} s)") from None


@attrs.frozen
class Call:
    message: bytes  # the request's one message, encoded
    streaming: bool  # a server stream (enveloped) rather than a unary call
    is_json: bool  # protobuf's JSON mapping rather than binary protobuf


async def read_request(request: web.Request) -> Call:
    kind = request.content_type
    if kind not in UNARY and kind not in STREAM:
        raise UnsupportedMediaType(f"Content-Type: expected one of {', '.join([*UNARY, *STREAM])}, got {kind!r}")
    _check_encoding(request)
    body = await _read_body(request)
    if (still := request.get(STILL_AUTHORIZED)) is not None:
        still()  # up to a minute of body: a key revoked meanwhile acts no more
    if kind in UNARY:
        return Call(body, False, UNARY[kind])
    if len(body) < 5:
        raise InvalidInput("body: a Connect stream's request needs its five-byte envelope", field="body")
    flags, size = struct.unpack(">BI", body[:5])
    if size > MAX_MESSAGE:
        raise PayloadTooLarge(f"body: the envelope says {size} bytes; a message may be at most {MAX_MESSAGE}")
    if flags & _COMPRESSED:
        raise InvalidInput("body: the message is compressed; send it uncompressed", field="body")
    if len(body) != 5 + size:
        raise InvalidInput(f"body: the envelope says {size} bytes and {len(body) - 5} came; a server stream "
                           "takes exactly one request message", field="body")
    return Call(body[5:], True, STREAM[kind])


def unary(message: bytes, is_json: bool) -> web.Response:
    return web.Response(body=message, content_type="application/json" if is_json else "application/proto")


def envelope(message: bytes) -> bytes:
    return struct.pack(">BI", 0, len(message)) + message


async def open_stream(request: web.Request, is_json: bool) -> web.StreamResponse:
    kind = "application/connect+json" if is_json else "application/connect+proto"
    response = web.StreamResponse(status=200, headers={"Content-Type": kind})
    await response.prepare(request)
    return response


async def end_stream(response: web.StreamResponse, err: BaseException | None = None) -> None:
    payload: dict[str, object] = {}
    if err is not None:
        code, message = code_of(err)
        payload["error"] = {"code": code, "message": message}
    raw = json.dumps(payload).encode()
    await response.write(struct.pack(">BI", _END_STREAM, len(raw)) + raw)
    await response.write_eof()


def timeout_ms(request: web.Request) -> int | None:
    """The client's deadline for the call (``Connect-Timeout-Ms``), if it gave one."""
    raw = request.headers.get("Connect-Timeout-Ms")
    if raw is None:
        return None
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 10:  # "²" is a digit to isdigit, not to int()
        raise InvalidInput(f"Connect-Timeout-Ms: expected up to 10 digits, got {raw!r}", field="Connect-Timeout-Ms")
    return int(raw)
