"""`hutch sandbox history SANDBOX [--at EVENT|TIME]`: the timeline, or the sandbox as of then;
`hutch sandbox fork SANDBOX -n N`: copies of it as it is now."""

from __future__ import annotations

import argparse
from typing import Any

from hutch import history
from hutch._connection import segment
from hutch.cli import _render as render
from hutch.cli._common import _call, _json_flag, _out


def add_parsers(sb: Any) -> None:
    f = sb.add_parser("fork", help="fork SANDBOX -n N: N new sandboxes with its files and env as they are now")
    f.add_argument("sandbox_id", metavar="SANDBOX")
    f.add_argument("-n", "--count", type=int, default=1, help="how many copies (1-20)")
    _json_flag(f)
    f.set_defaults(handler=cmd_fork)
    p = sb.add_parser("history", help="a sandbox's timeline, or with --at the sandbox as of an event or time")
    p.add_argument("sandbox_id", metavar="SANDBOX")
    p.add_argument("--at", metavar="EVENT|TIME", help="an event id (evt_…) or an ISO 8601 time")
    _json_flag(p)
    p.set_defaults(handler=cmd_history)


def cmd_fork(args: argparse.Namespace) -> int:
    async def work(client: Any) -> Any:
        return await client.connection.request("POST", f"/sandbox/{segment(args.sandbox_id)}/fork",
                                               json={"count": args.count}, sandbox_id=args.sandbox_id)

    data = _call(args, work)["data"]
    if args.json:
        render.dump_json(data, _out())
    else:
        for sb in data["sandboxes"]:
            _out().write(sb["sandboxId"] + "\n")
    return 0


def cmd_history(args: argparse.Namespace) -> int:
    out = _out()
    if args.at:
        then = _call(args, lambda c: history.as_of(c, args.sandbox_id, args.at))
        if args.json:
            render.dump_json(then, out)
            return 0
        event = then["asOf"]
        out.write(f"as of {event['eventId']} ({event['type']}, {event['createdAt']}, position {event['position']})\n")
        render.key_values([("status", then["status"]), ("executions", then.get("executions")),
                           ("env", " ".join(f"{k}={v}" for k, v in sorted(then.get("env", {}).items())) or "-")], out)
        return 0
    steps = _call(args, lambda c: history.history(c, args.sandbox_id))
    if args.json:
        render.dump_json({"history": steps}, out)
        return 0
    render.history(steps, out)
    return 0
