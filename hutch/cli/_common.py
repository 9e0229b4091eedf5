"""What every ``hutch`` command module shares: the parser class and common flags, the usage
error, and the plumbing that runs client work against a server (or an in-process engine) and
writes to the terminal.

Kept apart from ``hutch/cli/__init__.py`` so the command modules import it without importing
the entry point that imports them.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn, TypeVar

from hutch.client import SandboxClient, local_client

T = TypeVar("T")


class UsageError(Exception):
    """A flag or value the user got wrong: reported like argparse does, exit 2."""


# ---------------------------------------------------------------- parser


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n")


def _json_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    # Also accepted after the subcommand; SUPPRESS keeps a value given before it.
    p.add_argument("--url", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    p.add_argument("--api-key", default=argparse.SUPPRESS, help=argparse.SUPPRESS)


def _command_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("command", nargs="*", metavar="CMD", help="the command, after --")


# ---------------------------------------------------------------- plumbing


def _out() -> Any:
    return sys.stdout


def _remote_client(args: argparse.Namespace) -> SandboxClient:
    return SandboxClient(args.url, args.api_key, org_id=getattr(args, "org", None) or args.org_id)


async def _with_client(
    args: argparse.Namespace, work: Callable[[SandboxClient], Awaitable[T]]
) -> T:
    async with _remote_client(args) as client:
        if client.org_id is not None and not client.org_id.startswith("org_"):
            client.org_id = await _org_by_name(client, client.org_id)
        return await work(client)


async def _org_by_name(client: SandboxClient, name: str) -> str:
    """``--org acme`` (the name given to ``org create``) means the organization of that name
    among those this key may act for; ids look like ``org_acme``."""
    client.org_id = None  # listing with the key's own rights
    orgs = await client.tenancy.list_orgs()
    found = [o.id for o in orgs if o.name == name]
    if len(found) == 1:
        return found[0]
    known = ", ".join(f"{o.id} ({o.name})" for o in orgs) or "none"
    raise UsageError(f"--org {name!r}: no organization of that name that this key may act for "
                     f"(organization ids look like org_{name}; this key's: {known})")


def _remote_wanted(args: argparse.Namespace) -> bool:
    """Whether a server is named (--url, HUTCH_URL) or runs on the data dir; else the engine runs
    in this process (hutch/_config.py's rule). --data-dir/--driver ask for the engine here."""
    if args.url or os.environ.get("HUTCH_URL"):
        return True
    from hutch import _config

    return not (getattr(args, "data_dir", None) or getattr(args, "driver", None)) \
        and _config.local_server_url() is not None


async def _in_process(args: argparse.Namespace, work: Callable[[SandboxClient], Awaitable[T]]) -> T:
    """Run the engine inside this process, reachable only through a private Unix socket."""
    async with local_client(data_dir=args.data_dir, driver=args.driver) as client:
        return await work(client)


def _stdout_sink() -> Any:
    sys.stdout.flush()
    return getattr(sys.stdout, "buffer", sys.stdout)


def _stderr_sink() -> Any:
    sys.stderr.flush()
    return getattr(sys.stderr, "buffer", sys.stderr)


def _exit_code(code: int | None) -> int:
    if code is None:
        return 1
    if code < 0:  # killed by a signal, as some backends report it
        return min(128 - code, 255)
    return code if code <= 255 else 255


def _call(args: argparse.Namespace, work: Callable[[SandboxClient], Awaitable[T]]) -> T:
    """Run one piece of client work against the server the flags name."""
    return asyncio.run(_with_client(args, work))


def _note(message: str) -> None:
    sys.stderr.write(f"hutch: {message}\n")
    sys.stderr.flush()


def _status_note(status: str | None, truncated: bool | None, error: str | None = None) -> None:
    if status == "timeout":
        _note("the command hit its time limit and was stopped" + (f" ({error})" if error else ""))
    elif status == "cancelled":
        _note("the command was cancelled" + (f": {error}" if error else ""))
    elif status == "failed" and error and "out of memory" in error:
        _note(f"the command was {error}: raise the sandbox's memory (--memory, e.g. --memory 1Gi)")
    elif status == "failed":
        _note(f"the command failed: {error}" if error else "the command could not be run (status: failed)")
    if truncated:
        _note("output was truncated at the server's cap")
