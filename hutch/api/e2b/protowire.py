"""The protobuf wire format, as much of it as envd's messages use: varints, zigzag (sint32),
length-delimited fields (strings, bytes, nested messages, map entries), packed or not.

Hand-written rather than generated: envd's process service needs a dozen small messages, and
a reader that returns every field it finds (``fields``) lets each message be read by number
the way its ``.proto`` (e2b-dev/E2B spec/envd/process/process.proto) numbers it, with fields
it does not know skipped, as protobuf readers must."""

from __future__ import annotations

from collections.abc import Iterable

from hutch.core.errors import InvalidInput

VARINT, I64, LEN, I32 = 0, 1, 2, 5
Value = int | bytes


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # negative int32/int64 are ten-byte two's complement on the wire
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise InvalidInput("protobuf: a varint runs past the end of the message", field="body")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def fields(data: bytes) -> dict[int, list[Value]]:
    """Every field of a message by number, in the order sent (a repeated field has several)."""
    out: dict[int, list[Value]] = {}
    pos = 0
    while pos < len(data):
        key, pos = _read_varint(data, pos)
        number, kind = key >> 3, key & 7
        value: Value
        if kind == VARINT:
            value, pos = _read_varint(data, pos)
        elif kind == LEN:
            size, pos = _read_varint(data, pos)
            if pos + size > len(data):
                raise InvalidInput("protobuf: a field runs past the end of the message", field="body")
            value, pos = data[pos:pos + size], pos + size
        elif kind == I64:
            value, pos = int.from_bytes(data[pos:pos + 8], "little"), pos + 8
        elif kind == I32:
            value, pos = int.from_bytes(data[pos:pos + 4], "little"), pos + 4
        else:
            raise InvalidInput(f"protobuf: wire type {kind} of field {number} is not one protobuf has",
                               field="body")
        if number == 0 or pos > len(data):
            raise InvalidInput("protobuf: the message is malformed", field="body")
        out.setdefault(number, []).append(value)
    return out


def last(found: dict[int, list[Value]], number: int, kind: type[int] | type[bytes]) -> Value | None:
    """A singular field: the last one sent wins (protobuf's merge rule)."""
    values = found.get(number)
    if not values:
        return None
    value = values[-1]
    if not isinstance(value, kind):
        raise InvalidInput(f"protobuf: field {number} has the wrong wire type", field="body")
    return value


def text(found: dict[int, list[Value]], number: int) -> str | None:
    value = last(found, number, bytes)
    if value is None:
        return None
    assert isinstance(value, bytes)
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError as err:
        raise InvalidInput(f"protobuf: string field {number} is not UTF-8", field="body") from err


def texts(found: dict[int, list[Value]], number: int) -> list[str]:
    out = []
    for value in found.get(number, []):
        if not isinstance(value, bytes):
            raise InvalidInput(f"protobuf: field {number} has the wrong wire type", field="body")
        try:
            out.append(value.decode("utf-8"))
        except UnicodeDecodeError as err:
            raise InvalidInput(f"protobuf: string field {number} is not UTF-8", field="body") from err
    return out


def uint(number: int, value: int | None) -> bytes:
    """A varint field (uint32, bool, enum); absent when None."""
    return b"" if value is None else _varint(number << 3 | VARINT) + _varint(int(value))


def sint(number: int, value: int | None) -> bytes:
    """A zigzag varint field (sint32/sint64)."""
    return b"" if value is None else uint(number, (value << 1) ^ (value >> 63))


def unzigzag(value: int) -> int:
    return (value >> 1) ^ -(value & 1)


def blob(number: int, value: bytes | str | None) -> bytes:
    """A length-delimited field: bytes, a string, or a message already encoded; absent when None."""
    if value is None:
        return b""
    raw = value.encode("utf-8") if isinstance(value, str) else value
    return _varint(number << 3 | LEN) + _varint(len(raw)) + raw


def repeated(number: int, values: Iterable[bytes | str]) -> bytes:
    return b"".join(blob(number, v) for v in values)


def string_map(number: int, values: dict[str, str]) -> bytes:
    """A ``map<string, string>``: one entry message (key 1, value 2) per pair."""
    return b"".join(blob(number, blob(1, k) + blob(2, v)) for k, v in values.items())


def read_string_map(found: dict[int, list[Value]], number: int) -> dict[str, str]:
    out = {}
    for entry in found.get(number, []):
        if not isinstance(entry, bytes):
            raise InvalidInput(f"protobuf: map field {number} has the wrong wire type", field="body")
        pair = fields(entry)
        out[text(pair, 1) or ""] = text(pair, 2) or ""
    return out
