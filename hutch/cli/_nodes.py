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
