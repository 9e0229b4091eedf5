"""``hutch mcp [--http HOST:PORT]``: serve hutch sandboxes to MCP clients (hutch/mcp_server.py)."""

from __future__ import annotations

import argparse
import asyncio
import os
from typing import Any

from hutch.cli._common import UsageError

_NEEDS = "`hutch mcp` needs the MCP SDK: pip install 'hutch[mcp]'"


def add_parsers(top: Any) -> None:
    p = top.add_parser("mcp", help="serve sandboxes to MCP clients (Claude Desktop, Claude Code, Cursor …) "
                       "over stdio, or streamable HTTP with --http")
    p.add_argument("--http", metavar="HOST:PORT",
                   help="serve streamable HTTP at http://HOST:PORT/mcp instead of stdio; each client sends "
                        "its own hutch key as Authorization: Bearer KEY")
    p.add_argument("--max-org-sessions", type=int, default=None, metavar="N",
                   help="with --http: the MCP sessions one organization may hold open at once (default 100)")
    p.set_defaults(handler=cmd_mcp)


def _server_url(args: argparse.Namespace) -> str:
    from hutch import _config

    url = args.url or os.environ.get("HUTCH_URL") or _config.local_server_url()
    if not url:
        raise UsageError("no hutch server to serve: set HUTCH_URL (or --url), or start one with `hutch serve`")
    return str(url)


def _bind(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise UsageError(f"--http {value!r}: expected HOST:PORT with a port from 1 to 65535, e.g. 127.0.0.1:8701")
    return host, int(port)


def cmd_mcp(args: argparse.Namespace) -> int:
    url = _server_url(args)
    bind = _bind(args.http) if args.http else None
    try:
        from hutch import mcp_server
    except ImportError as err:
        raise UsageError(f"{_NEEDS} ({err})") from err
    if bind is None and args.max_org_sessions is not None:
        raise UsageError("--max-org-sessions is for --http: over stdio the process is the one session")
    if bind is not None:
        if args.api_key:
            raise UsageError("--api-key is for stdio: over HTTP each client sends its own key "
                             "(Authorization: Bearer KEY)")
        if args.org_id:
            raise UsageError("--org-id is for stdio: over HTTP each client's key decides its organization "
                             "(give each client a key of the organization it works in)")
        from hutch import mcp_http, mcp_listener

        sessions = mcp_http.ORG_SESSIONS if args.max_org_sessions is None else args.max_org_sessions
        if sessions < 1:
            raise UsageError(f"--max-org-sessions {sessions}: expected a number of sessions, 1 or more")
        try:
            head_seconds, most_waiting = mcp_listener.settings()
        except ValueError as err:
            raise UsageError(str(err)) from err
        mcp_http.serve_http(url, *bind, org_sessions=sessions, head_seconds=head_seconds, most_waiting=most_waiting)
        return 0
    asyncio.run(_stdio(mcp_server, url, args.api_key, args.org_id))
    return 0


async def _stdio(mcp_server: Any, url: str, api_key: str | None, org_id: str | None) -> None:
    from hutch.client import SandboxClient

    # A bad key, an organization the key may not act in or an absent server is said now, once,
    # rather than as every tool call's error.
    async with SandboxClient(url, api_key, org_id=org_id) as client:
        await client.tenancy.list_orgs()
        if org_id is not None:
            await client.list()
    await mcp_server.serve_stdio(url, api_key, org_id)
