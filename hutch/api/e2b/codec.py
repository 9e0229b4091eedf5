"""envd's messages as plain dicts (keys: the ``.proto`` field names), read from and written to
the two encodings Connect carries: binary protobuf (``application/proto``, ``…connect+proto``)
and protobuf's JSON mapping (``application/json``, ``…connect+json``: lowerCamelCase names,
bytes in base64, enums by name), which E2B's own SDKs send.

A message's schema maps each field name to (number, kind, what): kind is a scalar kind
(string, bytes, bool, uint32, sint32, int64, enum, or timestamp: a
``google.protobuf.Timestamp`` given as unix seconds), a message (``what``: its schema), a
``map`` of strings, or ``repeated`` one of those."""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
import math
from typing import Any

from hutch.api.e2b import protowire as pw
from hutch.api.http import parse_json
from hutch.core.errors import InvalidInput

Schema = dict[str, tuple[int, str, Any]]
_INTS = ("uint32", "sint32", "enum")


def _element(what: Any) -> tuple[str, Any]:
    """What a repeated field holds: a scalar kind by name, or messages of a schema."""
    return ("message", what) if isinstance(what, dict) else (what, None)


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(word.title() for word in rest)


# ------------------------------------------------------------------ binary


def to_proto(schema: Schema, msg: dict[str, Any]) -> bytes:
    out = b""
    for name, (number, kind, what) in schema.items():
        value = msg.get(name)
        if value is None:
            continue
        if kind == "repeated":
            out += b"".join(_one_proto(number, *_element(what), item) for item in value)
        elif kind == "map":
            out += pw.string_map(number, value)
        else:
            out += _one_proto(number, kind, what, value)
    return out


def _one_proto(number: int, kind: str, what: Any, value: Any) -> bytes:
    if kind == "timestamp":
        nanos, seconds = math.modf(value)
        return pw.blob(number, pw.uint(1, int(seconds)) + pw.uint(2, round(nanos * 1e9)))
    if kind == "message":
        return pw.blob(number, to_proto(what, value))
    if kind in ("string", "bytes"):
        return pw.blob(number, value)
    if kind == "sint32":
        return pw.sint(number, value)
    if kind == "enum" and isinstance(value, str):
        return pw.uint(number, what[value])
    return pw.uint(number, int(value))  # uint32, bool, enum by number


def from_proto(schema: Schema, raw: bytes) -> dict[str, Any]:
    found = pw.fields(raw)
    out: dict[str, Any] = {}
    for name, (number, kind, what) in schema.items():
        if number not in found:
            continue
        if kind == "repeated":
            out[name] = [_one_from_proto(*_element(what), v, name) for v in found[number]]
        elif kind == "map":
            out[name] = pw.read_string_map(found, number)
        else:
            out[name] = _one_from_proto(kind, what, found[number][-1], name)
    return out


def _one_from_proto(kind: str, what: Any, value: pw.Value, name: str) -> Any:
    want_bytes = kind in ("string", "bytes", "message", "timestamp")
    if want_bytes != isinstance(value, bytes):
        raise InvalidInput(f"{name}: the wrong protobuf wire type", field=name)
    if kind == "message":
        assert isinstance(value, bytes)
        return from_proto(what, value)
    if kind == "timestamp":
        assert isinstance(value, bytes)
        parts = pw.fields(value)
        return int(pw.last(parts, 1, int) or 0) + int(pw.last(parts, 2, int) or 0) / 1e9
    if kind == "string":
        assert isinstance(value, bytes)
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError as err:
            raise InvalidInput(f"{name}: not UTF-8", field=name) from err
    if kind == "bytes":
        return value
    assert isinstance(value, int)
    if kind == "bool":
        return bool(value)
    if kind == "sint32":
        return pw.unzigzag(value)
    return value & 0xFFFFFFFF if kind == "uint32" else value


# ------------------------------------------------------------------ JSON


def to_json(schema: Schema, msg: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, (_number, kind, what) in schema.items():
        value = msg.get(name)
        if value is None:
            continue
        if kind == "repeated":
            out[_camel(name)] = [_one_to_json(*_element(what), v) for v in value]
        elif kind == "map":
            out[_camel(name)] = dict(value)
        else:
            out[_camel(name)] = _one_to_json(kind, what, value)
    return out


def _one_to_json(kind: str, what: Any, value: Any) -> Any:
    if kind == "timestamp":
        return dt.datetime.fromtimestamp(value, dt.UTC).isoformat().replace("+00:00", "Z")
    if kind == "int64":
        return str(value)  # protobuf's JSON mapping: 64-bit integers are strings
    if kind == "message":
        return to_json(what, value)
    if kind == "bytes":
        return base64.b64encode(value).decode("ascii")
    if kind == "enum" and isinstance(value, int):
        return next((k for k, v in what.items() if v == value), value)
    if kind == "bool":
        return bool(value)
    return value


def from_json(schema: Schema, data: object, where: str = "body") -> dict[str, Any]:
    if not isinstance(data, dict):
        raise InvalidInput(f"{where}: expected a JSON object", field=where)
    out: dict[str, Any] = {}
    for name, (_number, kind, what) in schema.items():
        value = data.get(_camel(name), data.get(name))
        if value is None:
            continue
        field = name if where == "body" else f"{where}.{name}"
        if kind == "repeated":
            if not isinstance(value, list):
                raise InvalidInput(f"{field}: expected a list", field=field)
            out[name] = [_one_from_json(*_element(what), v, field) for v in value]
        elif kind == "map":
            if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
                raise InvalidInput(f"{field}: expected an object of strings", field=field)
            out[name] = dict(value)
        else:
            out[name] = _one_from_json(kind, what, value, field)
    return out


def _one_from_json(kind: str, what: Any, value: object, field: str) -> Any:
    if kind == "timestamp":
        try:
            return dt.datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
        except ValueError as err:
            raise InvalidInput(f"{field}: expected an RFC 3339 time", field=field) from err
    if kind == "int64" and isinstance(value, str | int) and not isinstance(value, bool):
        try:
            return int(value)
        except ValueError as err:
            raise InvalidInput(f"{field}: expected a 64-bit integer", field=field) from err
    if kind == "message":
        return from_json(what, value, field)
    if kind == "string":
        if not isinstance(value, str):
            raise InvalidInput(f"{field}: expected a string", field=field)
        return value
    if kind == "bytes":
        if not isinstance(value, str):
            raise InvalidInput(f"{field}: expected base64 text", field=field)
        try:
            return base64.b64decode(value + "=" * (-len(value) % 4), altchars=b"-_" if "-" in value or "_" in value
                                    else None, validate=True)
        except (binascii.Error, ValueError) as err:
            raise InvalidInput(f"{field}: not base64", field=field) from err
    if kind == "bool":
        if not isinstance(value, bool):
            raise InvalidInput(f"{field}: expected true or false", field=field)
        return value
    if kind == "enum" and isinstance(value, str):
        if value not in what:
            raise InvalidInput(f"{field}: expected one of {', '.join(what)}, got {value!r}", field=field)
        return what[value]
    if isinstance(value, str):
        digits = value.removeprefix("-")
        if digits.isascii() and digits.isdigit() and len(digits := digits.lstrip("0")) <= 10:
            # ASCII only: "²" is a digit to str.isdigit and not to int(); at most 10 digits (a
            # 32-bit one has 10): int() of more than 4,300 raises ValueError, a 500 here before,
            # leading zeros too: they are left out of it.
            value = (-1 if value.startswith("-") else 1) * int(digits or "0")
    if isinstance(value, bool) or not isinstance(value, int) or not -2**31 <= value < 2**32:
        shown = repr(value) if len(repr(value)) <= 64 else f"{repr(value)[:64]}... ({len(repr(value))} characters)"
        raise InvalidInput(f"{field}: expected a 32-bit integer, got {shown}", field=field)
    return value


def decode(schema: Schema, raw: bytes, is_json: bool) -> dict[str, Any]:
    if not is_json:
        return from_proto(schema, raw)
    # hutch's one JSON reader: a nesting as deep as the parser recurses, a 5000-digit number,
    # NaN or a NUL is a 400 naming the body, not a RecursionError or ValueError (a 500).
    return from_json(schema, parse_json(raw) if raw.strip() else {})


def encode(schema: Schema, msg: dict[str, Any], is_json: bool) -> bytes:
    return json.dumps(to_json(schema, msg)).encode() if is_json else to_proto(schema, msg)
