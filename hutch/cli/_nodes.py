"""``hutch node serve``: run this machine's node agent (docs/node.md)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any


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


def cmd_node_serve(args: argparse.Namespace) -> int:
    import logging

    from hutch.node.config import SettingError, settings
    from hutch.node.serve import serve

    try:
        s = settings(args.name, args.listen, args.data_dir)
    except SettingError as err:
        print(f"hutch node serve: {err}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(serve(s))
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
