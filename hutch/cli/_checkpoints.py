"""`hutch sandbox checkpoint|ckpt …` and `hutch sandbox stats`."""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from typing import Any

from hutch.cli import _render as render
from hutch.cli._common import UsageError, _call, _json_flag, _note, _out, _Parser
from hutch.models import Checkpoint, to_wire


def add_parsers(sb: Any) -> None:
    ckpt = sb.add_parser("checkpoint", aliases=["ckpt"], help="disk checkpoints: restore points of a sandbox's files")
    cp = ckpt.add_subparsers(dest="checkpoint_action", metavar="ACTION", parser_class=_Parser)
    cp.required = True
    create = cp.add_parser("create", aliases=["new"], help="checkpoint create SANDBOX_ID NAME")
    create.add_argument("sandbox_id", metavar="SANDBOX_ID")
    create.add_argument("name", metavar="NAME")
    _json_flag(create)
    create.set_defaults(handler=cmd_create)
    ls = cp.add_parser("list", aliases=["ls"], help="checkpoint list SANDBOX_ID")
    ls.add_argument("sandbox_id", metavar="SANDBOX_ID")
    _json_flag(ls)
    ls.set_defaults(handler=cmd_list)
    for verb, handler, text in (("restore", cmd_restore, "bring the files back to a checkpoint"),
                                ("delete", cmd_delete, "delete a checkpoint")):
        p = cp.add_parser(verb, aliases=["rm"] if verb == "delete" else [], help=text)
        p.add_argument("sandbox_id", metavar="SANDBOX_ID")
        p.add_argument("checkpoint_id", metavar="CHECKPOINT", help="the checkpoint's id (ckpt_…) or name")
        if verb == "delete":
            p.add_argument("--confirm", action="store_true", help="do not ask (asked only on a terminal)")
        _json_flag(p)
        p.set_defaults(handler=handler)

    stats = sb.add_parser("stats", help="usage of the sandboxes created in a time range")
    stats.add_argument("--start", type=_instant, help="ISO 8601 time, e.g. 2026-04-01T00:00:00Z")
    stats.add_argument("--end", type=_instant, help="ISO 8601 time (exclusive)")
    _json_flag(stats)
    stats.set_defaults(handler=cmd_stats)


def _instant(text: str) -> str:
    try:
        dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an ISO 8601 time such as 2026-04-01T00:00:00Z, got {text!r}") from None
    return text



def cmd_create(args: argparse.Namespace) -> int:
    cp = _call(args, lambda c: c.create_checkpoint(args.sandbox_id, args.name))
    if args.json:
        render.dump_json(to_wire(cp), _out())
    else:
        _out().write(f"{cp.id}\n")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    # Spelled out: hutch.client's own annotation reads `list` as its method.
    found: list[Checkpoint] = _call(args, lambda c: c.list_checkpoints(args.sandbox_id))
    if args.json:
        render.dump_json([to_wire(c) for c in found], _out())
        return 0
    if not found:
        _out().write("no checkpoints\n")
    for c in found:
        _out().write(f"{c.id}  {c.name}  {c.created_at}  parent={c.parent or '-'}\n")
    return 0


def cmd_restore(args: argparse.Namespace) -> int:
    _call(args, lambda c: c.restore_checkpoint(args.sandbox_id, args.checkpoint_id))
    if args.json:
        render.dump_json({"sandboxId": args.sandbox_id, "restored": args.checkpoint_id}, _out())
    else:
        _out().write(f"restored {args.checkpoint_id}\n")
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    if not args.confirm and sys.stdin.isatty() and not args.json:
        answer = input(f"Delete checkpoint {args.checkpoint_id} of {args.sandbox_id}? [y/N] ").strip().lower()
        if answer not in ("y", "yes"):
            _note("nothing deleted")
            return 1
    _call(args, lambda c: c.delete_checkpoint(args.sandbox_id, args.checkpoint_id))
    if args.json:
        render.dump_json({"sandboxId": args.sandbox_id, "deleted": args.checkpoint_id}, _out())
    else:
        _out().write(f"deleted {args.checkpoint_id}\n")
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    if args.start and args.end and args.start >= args.end:
        raise UsageError(f"--start {args.start} is not before --end {args.end}")
    stats = _call(args, lambda c: c.stats(start=args.start, end=args.end))
    if args.json:
        render.dump_json(stats, _out())
        return 0
    out = _out()
    sb, ex, jobs = stats.get("sandboxes", {}), stats.get("executions", {}), stats.get("jobs", {})
    out.write(f"sandboxes created: {sb.get('created', 0)}\n")
    for status, n in sorted(sb.get("byStatus", {}).items()):
        out.write(f"  {status}: {n}\n")
    out.write(f"executions: {ex.get('total', 0)} ({ex.get('wallTimeMs', 0)} ms)\n")
    for status, n in sorted(ex.get("byStatus", {}).items()):
        out.write(f"  {status}: {n}\n")
    out.write(f"jobs: {jobs.get('total', 0)} ({jobs.get('wallTimeMs', 0)} ms)\n")
    out.write(f"cpu: {stats.get('cpu', {}).get('seconds', 0)} s; "
              f"memory: {stats.get('memory', {}).get('gibSeconds', 0)} GiB-s (peak x lifetime)\n")
    return 0
