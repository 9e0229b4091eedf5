"""Time-sortable ids with the seeds' prefixes.

An id is ``prefix_`` + 26 Crockford base32 characters: 48 bits of milliseconds since
the epoch, then 80 random bits (the ULID layout), lower-cased. Sorting ids sorts them
by creation time, which list endpoints and humans both rely on.
"""

from __future__ import annotations

import os
import re
import time

PREFIXES = {
    "sandbox": "sbx",
    "execution": "exec",
    "job": "job",
    "snapshot": "snp",
    "checkpoint": "ckpt",
    "runtime": "srt",
    "event": "evt",
    "stream": "stm",
    "project": "proj",
    "key": "key",
    "ssh_key": "ssk",
}
_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"
_ID_RE = re.compile(r"^(?P<prefix>[a-z]+)_(?P<body>[0-9a-hjkmnp-tv-z]{26})\Z")


def new_id(kind: str, *, now_ms: int | None = None, random_bytes: bytes | None = None) -> str:
    prefix = PREFIXES[kind]
    ms = int(time.time() * 1000) if now_ms is None else now_ms
    rnd = os.urandom(10) if random_bytes is None else random_bytes
    value = (ms << 80) | int.from_bytes(rnd, "big")
    chars = []
    for _ in range(26):
        chars.append(_ALPHABET[value & 31])
        value >>= 5
    return f"{prefix}_{''.join(reversed(chars))}"


def is_id(kind: str, value: object) -> bool:
    if not isinstance(value, str):
        return False
    m = _ID_RE.match(value)
    return m is not None and m.group("prefix") == PREFIXES[kind]


def millis(kind: str, value: str) -> int | None:
    """The milliseconds since the epoch an id of ``kind`` was made at (``new_id``), or None if
    ``value`` is no such id."""
    if not is_id(kind, value):
        return None
    n = 0
    for ch in value.split("_", 1)[1]:
        n = n * 32 + _ALPHABET.index(ch)
    return n >> 80
