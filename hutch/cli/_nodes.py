"""``hutch node serve``: run this machine's node agent (docs/node.md)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from hutch.cli import _render as render
from hutch.cli._common import _call, _json_flag, _out


def add_parsers(top: Any) -> None:
    node = top.add_parser("node", help="the node agent of a cluster (docs/node.md)")
    sub = node.add_subparsers(dest="node_command", metavar="COMMAND", required=True)
    serve = sub.add_parser("serve", help="run this machine's node agent (root; HUTCH_NODE_SECRET_FILE)")
    serve.add_argument("--name", required=True, help="this node's name, as the API sees it")
    serve.add_argument("--listen", required=True, metavar="HOST:PORT", help="where the agent answers")
    serve.add_argument("--data-dir", required=True, help="the agent's sandboxes (one data dir per agent)")
    serve.set_defaults(handler=cmd_node_serve)
    reap = sub.add_parser("reap", help="end every sandbox of an agent's data dir (root; the agent stopped)")
    reap.add_argument("--data-dir", required=True, help="the stopped agent's data dir")
    reap.set_defaults(handler=cmd_node_reap)
    # Through the API, with the server administrator's key (--url, --api-key or HUTCH_URL,
    # HUTCH_API_KEY as every client command).
    nodes = sub.add_parser("list", aliases=["ls"], help="the nodes the API places sandboxes on (operator key)")
    _json_flag(nodes)
    nodes.set_defaults(handler=cmd_node_list)
    drain = sub.add_parser("drain", help="drain NODE: place no new sandbox there (--move: move its idle "
                                         "sandboxes off it; --undo: place there again)")
    drain.add_argument("node", metavar="NODE")
    drain.add_argument("--undo", action="store_true", help="put the node back in service")
    drain.add_argument("--move", action="store_true",
                       help="move its idle sandboxes to other nodes (files and env; processes do not follow)")
    _json_flag(drain)
    drain.set_defaults(handler=cmd_node_drain)


def cmd_node_serve(args: argparse.Namespace) -> int:
    import logging

    from hutch.node import certificate
    from hutch.node.config import SettingError, settings
    from hutch.node.serve import serve

    try:
        s = settings(args.name, args.listen, args.data_dir)
        cert = certificate.make(s.name)
    except SettingError as err:
        print(f"hutch node serve: {err}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(serve(s, cert))
    return 0


def cmd_node_reap(args: argparse.Namespace) -> int:
    """What a cluster's stop runs after its agents: a stopped agent leaves its sandboxes
    running (the next start adopts them), so ending them is its own, offline step."""
    import os
    from pathlib import Path

    from hutch.node.reap import reap

    if os.geteuid() != 0:
        print("hutch node reap: needs root (it ends sandboxes: cgroups, mounts, network)", file=sys.stderr)
        return 2
    data = Path(args.data_dir)
    if not (data / "sandboxes").is_dir():
        print(f"hutch node reap: {data} holds no sandboxes directory: not an agent's data dir", file=sys.stderr)
        return 2
    cache = Path(os.environ.get("HUTCH_RUNTIME_CACHE") or "/var/cache/hutch/runtimes")
    ended = asyncio.run(reap(data, cache))
    print(f"hutch node reap: ended {ended} sandboxes of {data}")
    return 0


def _node_line(n: dict[str, Any]) -> str:
    gib = 1 << 30
    state = n["state"] + (", draining" if n["draining"] else "")
    free = f"{n.get('memoryAvailable', 0) / gib:.1f}Gi available" if n["state"] == "up" else n.get("reason", "")
    return f"{n['name']}  {state}  {n['sandboxes']} sandboxes  {free}"


def cmd_node_list(args: argparse.Namespace) -> int:
    async def work(c: Any) -> Any:
        return c.connection.data(await c.connection.request("GET", "/nodes"))

    found = _call(args, work)["nodes"]
    if args.json:
        render.dump_json(found, _out())
        return 0
    for n in found:
        _out().write(_node_line(n) + "\n")
    return 0


def cmd_node_drain(args: argparse.Namespace) -> int:
    async def work(c: Any) -> Any:
        body = {flag: True for flag in ("undo", "move") if getattr(args, flag)}
        return c.connection.data(await c.connection.request("POST", f"/nodes/{args.node}/drain", json=body))

    answer = _call(args, work)
    if args.json:
        render.dump_json(answer, _out())
        return 0
    node = answer["node"]
    _out().write(_node_line(node) + "\n")
    for m in answer.get("moved", []):
        _out().write(f"moved {m['sandboxId']} from {m['fromNode']} to {m['toNode']}\n")
    for m in answer.get("left", []):
        _out().write(f"left {m['sandboxId']} on {node['name']}: {m['reason']}\n")
    if answer.get("note"):
        sys.stderr.write(f"hutch: {answer['note']}\n")
    if node["draining"]:
        sys.stderr.write(f"hutch: {node['name']} takes no new sandbox; what it still runs keeps running there\n")
    return 0
