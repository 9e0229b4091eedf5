"""Quantities as users write them: memory/disk ("512Mi", "1Gi", "512M", 1048576),
cpu ("500m", "0.5", "1") and durations ("30s", "5m", "1h", "1h30m", "0s").

Every parser takes the field name so a bad value becomes an error naming both.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

from hutch.core.errors import InvalidInput

_BINARY = {"ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}
_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "": 1, "b": 1}
_MEMORY_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgtKMGT]i?|[bB])?\s*$")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_DURATION_UNITS = {"ms": Decimal("0.001"), "s": Decimal(1), "m": Decimal(60), "h": Decimal(3600), "d": Decimal(86400)}
# Past any machine (a larger value reached the driver and failed there: ERANGE, OverflowError).
MAX_BYTES = 2**60  # 1 EiB
MAX_MILLICORES = 10**7  # 10,000 CPUs
# Past any sandbox's life, and far inside what a date holds: a timeout's deadline (now + it) past
# the year 9999, or past timedelta's 999,999,999 days, or infinity (10^400 days), was a 500 where
# it was used (a pause, E2B's end time), not where it was given.
MAX_DURATION_DAYS = 36500  # 100 years


def _bad(field: str, value: object, expected: str) -> InvalidInput:
    return InvalidInput(f"{field}: invalid value {value!r}; expected {expected}", field=field)


def parse_bytes(field: str, value: object) -> int:
    """Memory or disk size in bytes. Binary suffixes (Ki, Mi, Gi, Ti) and decimal ones (K, M, G, T)."""
    if isinstance(value, bool):
        raise _bad(field, value, "a size such as 512Mi, 1Gi or a number of bytes")
    if isinstance(value, int):
        if value <= 0:
            raise _bad(field, value, "a positive size")
        if value > MAX_BYTES:
            raise _bad(field, value, f"a size of at most {MAX_BYTES >> 40}Ti")
        return value
    if not isinstance(value, str):
        raise _bad(field, value, "a size such as 512Mi, 1Gi or a number of bytes")
    m = _MEMORY_RE.match(value)
    if not m:
        raise _bad(field, value, "a size such as 512Mi, 1Gi, 512M or a number of bytes")
    number, suffix = Decimal(m.group(1)), (m.group(2) or "").lower()
    mult = _BINARY.get(suffix) or _DECIMAL.get(suffix)
    if mult is None:  # pragma: no cover - the regex admits only known suffixes
        raise _bad(field, value, "a known unit")
    result = int(number * mult)
    if result <= 0:
        raise _bad(field, value, "a positive size")
    if result > MAX_BYTES:
        raise _bad(field, value, f"a size of at most {MAX_BYTES >> 40}Ti")
    return result


def parse_millicores(field: str, value: object) -> int:
    """CPU in millicores: "500m" -> 500, "0.5" -> 500, "2" -> 2000, 1 -> 1000."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise _bad(field, value, "cpu such as 500m, 0.5 or 2")
    text = str(value).strip()
    try:
        millis = Decimal(text[:-1]) if text.endswith("m") else Decimal(text) * 1000
    except InvalidOperation as err:
        raise _bad(field, value, "cpu such as 500m, 0.5 or 2") from err
    if not millis.is_finite() or millis <= 0 or millis != millis.to_integral_value():
        raise _bad(field, value, "a positive cpu amount in whole millicores")
    if millis > MAX_MILLICORES:
        raise _bad(field, value, f"at most {MAX_MILLICORES // 1000} CPUs")
    return int(millis)


def parse_duration(field: str, value: object) -> float:
    """Seconds. "0s" (or 0) means "no limit" where the seeds say so; callers decide."""
    return _duration(field, value, clamp=False)


def stored_duration(field: str, value: object) -> float:
    """Seconds of a duration as recorded. One past the cap was recorded before the cap was
    (eece1c6), and is no one's to change now: it reads as the cap, 100 years, wherever a
    deadline is made of it (the reaper's, a pause's end, E2B's endAt, a command's limit), where
    it was an error there (a 400 naming a field the call did not give, or a 500)."""
    return _duration(field, value, clamp=True)


def _duration(field: str, value: object, *, clamp: bool) -> float:
    cap = MAX_DURATION_DAYS * 86400
    if isinstance(value, bool):
        raise _bad(field, value, "a duration such as 30s, 5m or 1h")
    if isinstance(value, (int, float)):
        if value < 0:
            raise _bad(field, value, "a non-negative duration")
        if not value <= cap:  # NaN too
            if clamp:
                return float(cap)
            raise _bad(field, value, f"a duration of at most {MAX_DURATION_DAYS}d")
        return float(value)
    if not isinstance(value, str) or not value.strip():
        raise _bad(field, value, "a duration such as 30s, 5m or 1h")
    text = value.strip()
    pos, total = 0, Decimal(0)
    for m in _DURATION_PART.finditer(text):
        if m.start() != pos:
            raise _bad(field, value, "a duration such as 30s, 5m, 1h or 1h30m")
        try:
            total += Decimal(m.group(1)) * _DURATION_UNITS[m.group(2)]
        except ArithmeticError:  # past Decimal's exponent (a million digits): past the cap below
            total = Decimal("Infinity")
        pos = m.end()
    if pos != len(text) or pos == 0:
        raise _bad(field, value, "a duration such as 30s, 5m, 1h or 1h30m")
    if total > cap:
        if clamp:
            return float(cap)
        raise _bad(field, value if len(value) <= 64 else f"{value[:64]}...", f"a duration of at most {MAX_DURATION_DAYS}d")
    return float(total)


def format_bytes(n: int) -> str:
    for suffix, mult in (("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if n % mult == 0:
            return f"{n // mult}{suffix}"
    return str(n)


def format_millicores(m: int) -> str:
    return f"{m // 1000}" if m % 1000 == 0 else f"{m}m"


def format_duration(seconds: float) -> str:
    if seconds == int(seconds):
        s = int(seconds)
        for unit, size in (("h", 3600), ("m", 60)):
            if s and s % size == 0:
                return f"{s // size}{unit}"
        return f"{s}s"
    return f"{round(seconds * 1000)}ms"
