"""Human-readable output for the CLI: aligned tables and key/value blocks."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any, TextIO

from hutch.models import (
    ExecutionInfo,
    Job,
    Runtime,
    SandboxEvent,
    SandboxFileInfo,
    SandboxInfo,
    to_wire,
)


def dump_json(obj: Any, out: TextIO) -> None:
    out.write(json.dumps(obj, indent=2, sort_keys=False) + "\n")


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], out: TextIO) -> None:
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    for row in [list(headers), *cells]:
        out.write("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() + "\n")


def key_values(pairs: Iterable[tuple[str, Any]], out: TextIO) -> None:
    shown = [(k, _cell(v)) for k, v in pairs if v not in (None, "", [], {})]
    width = max((len(k) for k, _ in shown), default=0)
    for key, value in shown:
        out.write(f"{(key + ':').ljust(width + 1)} {value}\n")


def shown(text: str) -> str:
    """``text`` as a terminal shows it verbatim: what is not printable as itself (controls,
    escape sequences, newlines, direction overrides) escaped as Python writes it. Names,
    labels and metadata are anyone's in the organization; printed raw, one set the terminal
    of whoever listed them (its clipboard, its screen, a forged row)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (list, tuple)):
        return shown(" ".join(str(v) for v in value))
    if isinstance(value, dict):
        return json.dumps(value, separators=(",", ":"))  # JSON escapes controls itself
    return shown(str(value))


def duration_ms(ms: int | None) -> str | None:
    if ms is None:
        return None
    return f"{ms}ms" if ms < 1000 else f"{ms / 1000:.2f}s"


def sandboxes(items: Sequence[SandboxInfo], total: int, out: TextIO) -> None:
    if not items:
        out.write("no sandboxes\n")
        return
    table(
        ["ID", "NAME", "STATUS", "MODE", "RUNTIME", "EXECS", "CREATED"],
        [
            [
                s.sandbox_id,
                s.name,
                s.status,
                s.mode,
                s.runtime.name if s.runtime else None,
                s.executions,
                s.created_at,
            ]
            for s in items
        ],
        out,
    )
    if total > len(items):
        out.write(f"({len(items)} of {total}; use --limit/--offset for more)\n")


def sandbox(info: SandboxInfo, out: TextIO) -> None:
    resources = info.resources
    timeout = info.timeout
    key_values(
        [
            ("id", info.sandbox_id),
            ("name", info.name),
            ("description", info.description),
            ("status", info.status),
            ("mode", info.mode),
            ("runtime", info.runtime.name if info.runtime else None),
            ("snapshot", info.snapshot.id if info.snapshot else None),
            ("created", info.created_at),
            ("executions", info.executions),
            ("exit code", info.exit_code),
            ("memory", resources.memory if resources else None),
            ("cpu", resources.cpu if resources else None),
            ("disk", resources.disk if resources else None),
            ("network", info.network_enabled),
            ("port", info.network_port),
            ("url", info.url),
            ("idle timeout", timeout.idle if timeout else None),
            ("exec timeout", timeout.execution if timeout else None),
            ("paused timeout", timeout.paused if timeout else None),
            ("cpu time", duration_ms(info.cpu_time_ms)),
            ("memory peak", f"{info.memory_peak_bytes / 2**20:.1f} MiB" if info.memory_peak_bytes else None),
            ("memory used", f"{info.memory_byte_sec / 2**30:.3f} GiB·s" if info.memory_byte_sec else None),
            ("command", info.command.exec if info.command else None),
            ("metadata", info.metadata),
            ("stdout", info.stdout_stream_url),
            ("stderr", info.stderr_stream_url),
        ],
        out,
    )


def events(items: Sequence[SandboxEvent], out: TextIO) -> None:
    if not items:
        out.write("no events\n")
        return
    table(
        ["TIME", "TYPE", "EVENT ID", "DETAILS"],
        [[e.created_at, e.type, e.event_id, e.event or None] for e in items],
        out,
    )


def history(steps: Sequence[dict[str, Any]], out: TextIO) -> None:
    """A sandbox's timeline: each event and the status it left the sandbox in."""
    if not steps:
        out.write("no events\n")
        return
    table(
        ["POSITION", "TIME", "EVENT ID", "TYPE", "STATUS AFTER"],
        [[s["position"], s["createdAt"], s["eventId"], s["type"], s["status"]] for s in steps],
        out,
    )


def executions(items: Sequence[ExecutionInfo], out: TextIO) -> None:
    if not items:
        out.write("no executions\n")
        return
    table(
        ["ID", "STATUS", "EXIT", "DURATION", "STARTED", "COMMAND"],
        [
            [
                x.execution_id,
                x.status,
                x.exit_code,
                duration_ms(x.duration_ms),
                x.started_at,
                x.command,
            ]
            for x in items
        ],
        out,
    )


def execution(x: ExecutionInfo, out: TextIO) -> None:
    key_values(
        [
            ("id", x.execution_id),
            ("sandbox", x.sandbox_id),
            ("type", x.type),
            ("status", x.status),
            ("command", x.command),
            ("exit code", x.exit_code),
            ("duration", duration_ms(x.duration_ms)),
            ("started", x.started_at),
            ("completed", x.completed_at),
            ("error", x.error),
            ("output truncated", x.output_truncated),
            ("stdout", x.stdout_stream_url),
            ("stderr", x.stderr_stream_url),
        ],
        out,
    )


def runtimes(items: Sequence[Runtime], total: int, out: TextIO) -> None:
    if not items:
        out.write("no runtimes\n")
        return
    def state(r: Runtime) -> str:
        if r.building:
            return "building"
        if r.available is None:
            return ""
        return "built" if r.available else "on first use"

    def size(r: Runtime) -> str:
        return f"{r.size_bytes / 2**20:.0f} MiB" if r.size_bytes else ""

    table(
        ["NAME", "ID", "STATE", "SIZE", "BUILT", "DESCRIPTION"],
        [[r.name, r.id, state(r), size(r), r.built_at or "", r.description] for r in items],
        out,
    )
    if total > len(items):
        out.write(f"({len(items)} of {total}; use --limit/--offset for more)\n")


__all__ = [
    "dump_json",
    "events",
    "execution",
    "executions",
    "key_values",
    "runtimes",
    "sandbox",
    "sandboxes",
    "table",
    "to_wire",
]


def _mode_string(mode: str | None, is_dir: bool, is_symlink: bool | None) -> str:
    kind = "l" if is_symlink else "d" if is_dir else "-"
    try:
        bits = int(mode or "0", 8)
    except ValueError:
        return kind + "?????????"
    chars = "rwxrwxrwx"
    return kind + "".join(c if bits & (1 << (8 - i)) else "-" for i, c in enumerate(chars))


def files(items: Sequence[SandboxFileInfo], out: TextIO, *, long: bool = False) -> None:
    ordered = sorted(items, key=lambda f: f.path)
    if not long:
        for f in ordered:
            out.write(f.path + ("/" if f.is_dir else "") + "\n")
        return
    table(
        ["MODE", "SIZE", "MODIFIED", "NAME"],
        [
            [
                _mode_string(f.mode, f.is_dir, f.is_symlink),
                f.size,
                f.mod_time,
                f.path
                + ("/" if f.is_dir else "")
                + (f" -> {f.link_target}" if f.is_symlink and f.link_target else ""),
            ]
            for f in ordered
        ],
        out,
    )


def jobs(items: Sequence[Job], out: TextIO) -> None:
    if not items:
        out.write("no jobs\n")
        return
    table(
        ["ID", "STATUS", "EXIT", "STARTED", "COMMAND"],
        [[j.job_id, j.status, j.exit_code, j.started_at, " ".join(j.command)] for j in items],
        out,
    )


def job(j: Job, out: TextIO) -> None:
    key_values(
        [
            ("id", j.job_id),
            ("sandbox", j.sandbox_id),
            ("status", j.status),
            ("exit code", j.exit_code),
            ("command", " ".join(j.command)),
            ("started", j.started_at),
            ("completed", j.completed_at),
            ("error", j.error),
            ("stdout", j.stdout_stream_url),
            ("stderr", j.stderr_stream_url),
        ],
        out,
    )
