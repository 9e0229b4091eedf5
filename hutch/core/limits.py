"""How big what a client sends may be: env, commands, names, metadata — pure.

Linux's own limits are the guide, so that what hutch accepts never fails later inside a
sandbox with E2BIG. ``execve`` refuses any single argument or ``NAME=value`` longer than
``MAX_ARG_STRLEN`` (32 pages, its NUL included), and argv and env together beyond a
quarter of the stack limit (``ARG_MAX``: 2 MiB at the usual 8 MiB), counting each string
with its NUL and its pointer. A sandbox's env and a command's argv each get a budget well
inside that (``ENV_BYTES`` + ``ARGV_BYTES`` = 768 KiB), leaving room for what a driver adds
(its default variables, its own helper's arguments). Counts, names and metadata are capped
so that nothing a client sends grows the server's memory or its event log without bound:
every limit is far above what a real sandbox uses.

What the event log keeps of a command is bounded more tightly than what a command may be: the
log is kept for ever and shared by every tenant, so an event records the first
``RECORDED_ARGV_BYTES`` of a command's argv and how many bytes it left out, with the SHA-256
of the whole (``recorded_argv``); the driver is handed the whole argv all the same.
"""

from __future__ import annotations

import codecs
import hashlib
import json
from collections.abc import Iterable, Mapping

import attrs

from hutch.core.errors import InvalidInput, PayloadTooLarge

MAX_ARG_STRLEN = 32 * 4096  # Linux: one argument or one NAME=value, with its NUL
POINTER = 8  # execve counts a pointer per string (64-bit)
ARG_MAX = 2 * 2**20  # Linux at an 8 MiB stack: argv and env, strings and pointers

ENV_BYTES = 256 * 2**10  # a sandbox's whole env, counted as execve counts it
ENV_VARS = 1024
ENV_NAME_CHARS = 255
ARGV_BYTES = 512 * 2**10  # one command's argv, likewise

NAME_CHARS = 255  # sandbox names, stdin stream names
TEXT_CHARS = 4096  # descriptions, messages
PATH_BYTES = 4096  # Linux's PATH_MAX
PUBLIC_KEY_CHARS = 16 * 2**10  # an OpenSSH public key line (RSA 16384 is under 3 KiB)
METADATA_BYTES = 64 * 2**10  # as JSON
METADATA_ITEMS = 1024  # keys and list items, at every level
METADATA_DEPTH = 8  # objects and lists within one another

RECORDED_ARGV_BYTES = 4096  # what an event keeps of a command's argv (recorded_argv)
# One directory's listing, as a driver reads it: a sandbox makes entries for the price of an
# inode each (200,000 empty files: 90 MB of its disk, 380 MB of the server's to list), and
# every listing is held whole in the server, so it is bounded as a body is.
LIST_ENTRIES = 100_000
LIST_BYTES = 32 * 2**20  # what a driver's helper may write to list them (as nomad's file operations)

assert ENV_BYTES + ARGV_BYTES <= ARG_MAX // 2  # the rest is the drivers' headroom


def _string_bytes(text: str) -> int:
    """What one execve string costs: its UTF-8 bytes, its NUL and its pointer."""
    return len(text.encode("utf-8", "surrogatepass")) + 1 + POINTER


def env_bytes(env: Mapping[str, str | None]) -> int:
    return sum(_string_bytes(f"{k}={v}") for k, v in env.items() if v is not None)


def argv_bytes(argv: Iterable[str]) -> int:
    return sum(_string_bytes(a) for a in argv)


def check_env_entry(name: str, value: str | None, field: str = "env") -> None:
    """One variable: a name of at most ``ENV_NAME_CHARS``, ``NAME=value`` within ``MAX_ARG_STRLEN``."""
    if len(name) > ENV_NAME_CHARS:
        raise InvalidInput(f"{field}: variable name {name[:40]!r}… is {len(name)} characters; "
                           f"at most {ENV_NAME_CHARS}", field=field)
    if value is not None and _string_bytes(f"{name}={value}") - POINTER > MAX_ARG_STRLEN:
        raise InvalidInput(f"{field}.{name}: {name}=value is {len(f'{name}={value}'.encode())} bytes; Linux takes "
                           f"at most {MAX_ARG_STRLEN - 1} for one variable (MAX_ARG_STRLEN)", field=f"{field}.{name}")


def check_env_count(count: int, field: str = "env") -> None:
    if count > ENV_VARS:
        raise InvalidInput(f"{field}: {count} variables; a sandbox may have at most {ENV_VARS}", field=field)


def check_env(env: Mapping[str, str], field: str = "env") -> None:
    """A sandbox's whole env (what every command of it starts with)."""
    check_env_count(len(env), field)
    for name, value in env.items():
        check_env_entry(name, value, field)
    if (size := env_bytes(env)) > ENV_BYTES:
        raise InvalidInput(f"{field}: the environment would take {size} bytes as execve counts them (each "
                           f"NAME=value, its NUL and pointer); a sandbox's may take at most {ENV_BYTES}",
                           field=field)


def check_argv(argv: Iterable[str], field: str = "command") -> None:
    argv = list(argv)
    for i, arg in enumerate(argv):
        if _string_bytes(arg) - POINTER > MAX_ARG_STRLEN:
            raise InvalidInput(f"{field}[{i}]: {len(arg.encode())} bytes; Linux takes at most {MAX_ARG_STRLEN - 1} "
                               "for one argument (MAX_ARG_STRLEN)", field=f"{field}[{i}]")
    if (size := argv_bytes(argv)) > ARGV_BYTES:
        raise InvalidInput(f"{field}: the arguments take {size} bytes as execve counts them (each with its NUL "
                           f"and pointer); a command may take at most {ARGV_BYTES}", field=field)


def check_chars(value: str | None, field: str, most: int) -> None:
    if value is not None and len(value) > most:
        raise InvalidInput(f"{field}: {len(value)} characters; at most {most}", field=field)


def check_metadata(value: object, field: str = "metadata") -> None:
    """Free-form JSON kept as given: bounded in size, item count and depth."""
    if value is None:
        return
    size = len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass"))
    if size > METADATA_BYTES:
        raise InvalidInput(f"{field}: {size} bytes as JSON; at most {METADATA_BYTES}", field=field)
    items, todo = 0, [(value, 1)]
    while todo:
        node, depth = todo.pop()
        if not isinstance(node, (dict, list)):
            continue
        if depth > METADATA_DEPTH:
            raise InvalidInput(f"{field}: nested {depth} levels deep; at most {METADATA_DEPTH}", field=field)
        children = list(node.values()) if isinstance(node, dict) else node
        items += len(children)
        if items > METADATA_ITEMS:
            raise InvalidInput(f"{field}: more than {METADATA_ITEMS} keys and items; at most {METADATA_ITEMS}",
                               field=field)
        todo.extend((child, depth + 1) for child in children)


@attrs.frozen
class RecordedArgv:
    """What an event keeps of an argv. Its bytes are counted as ``/proc/<pid>/cmdline`` lays
    them out (each argument's UTF-8 and a NUL): ``argv`` is their first ``RECORDED_ARGV_BYTES``
    (an argument the cut falls in kept as its start, the ones after it left out);
    ``omitted_bytes`` how many were left out and ``sha256`` the SHA-256 of the whole, so that
    an audit can still tell which command ran. Both None when nothing was left out."""

    argv: tuple[str, ...]
    omitted_bytes: int | None = None
    sha256: str | None = None


def cmdline(argv: Iterable[str]) -> bytes:
    """The argv as ``/proc/<pid>/cmdline`` shows it: each argument followed by a NUL."""
    return b"".join(arg.encode("utf-8", "surrogatepass") + b"\0" for arg in argv)


def recorded_argv(argv: Iterable[str], most: int = RECORDED_ARGV_BYTES) -> RecordedArgv:
    argv = tuple(argv)
    whole = cmdline(argv)
    if len(whole) <= most:
        return RecordedArgv(argv)
    kept: list[str] = []
    room = most
    for arg in argv:
        raw = arg.encode("utf-8", "surrogatepass")
        if len(raw) + 1 <= room:
            kept.append(arg)
            room -= len(raw) + 1
            continue
        # Cut on a character's boundary: a partial character at the end is left out too.
        start = codecs.getincrementaldecoder("utf-8")("surrogatepass").decode(raw[:room], final=False)
        if start:
            kept.append(start)
            room -= len(start.encode("utf-8", "surrogatepass"))
        break
    return RecordedArgv(tuple(kept), omitted_bytes=len(whole) - (most - room),
                        sha256=hashlib.sha256(whole).hexdigest())


def too_many_entries(path: str) -> PayloadTooLarge:
    """The refusal of a directory holding more entries than one listing answers (``LIST_ENTRIES``)."""
    return PayloadTooLarge(
        f"path: {path!r} holds more than {LIST_ENTRIES} entries (or {LIST_BYTES} bytes of names), the most one "
        "listing answers; list its subdirectories, or move some of its entries into some", field="path")
