"""The ``hutch`` command line.

    hutch serve                      start a server (flags or HUTCH_* env)
    hutch projector | projections rebuild | audit    production-profile operators' commands
    hutch run [flags] -- CMD ...     one-shot run; in-process unless HUTCH_URL/--url is set
    hutch sandbox|sb ...             create, list, get, delete, exec, events, execution, runtime
                                     pause|hibernate, resume|wake, network, fs|files|file, env, job
    hutch runtime|rt list|build      the catalog (from the server); build runtimes on this host
    hutch mcp [--http HOST:PORT]     serve sandboxes to MCP clients (stdio, or streamable HTTP)

Every sandbox command takes ``--json``. Exit codes: the command's own code for ``run`` and
``exec``; 0 on success otherwise; 1 when the server refused or could not be reached
(its message on stderr); 2 for a bad flag or value; 130 when interrupted.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

from hutch import _config
from hutch.cli import (
    _checkpoints,  # checkpoint (ckpt), stats
    _files_jobs,  # fs (files, file), env, job
    _history,  # history
    _mcp,  # mcp (the MCP server; its SDK imported only when it runs)
    _nodes,  # node serve
    _ops,  # hutch projector | projections rebuild | audit
    _sandbox,  # run; sandbox run, create, list, get, delete, exec, …; runtime
    _snapshots,  # snapshot (snap)
    _ssh,  # ssh (sandbox shell), ssh-key
    _tenancy,  # org, project, key
)
from hutch.cli._common import UsageError, _note, _Parser, _remote_wanted
from hutch.cli._sandbox import (  # the handlers, as hutch.cli has always offered them
    cmd_create,
    cmd_delete,
    cmd_events,
    cmd_exec,
    cmd_execution_get,
    cmd_execution_list,
    cmd_get,
    cmd_list,
    cmd_pause,
    cmd_resume,
    cmd_run,
    cmd_runtime_build,
    cmd_runtime_list,
)
from hutch.cli._values import _int_in
from hutch.core.errors import HutchError
from hutch.errors import ConnectionFailed, Unauthorized

__all__ = [
    "UsageError",
    "build_parser",
    "cmd_create",
    "cmd_delete",
    "cmd_events",
    "cmd_exec",
    "cmd_execution_get",
    "cmd_execution_list",
    "cmd_get",
    "cmd_list",
    "cmd_pause",
    "cmd_resume",
    "cmd_run",
    "cmd_runtime_build",
    "cmd_runtime_list",
    "cmd_serve",
    "main",
    "parse_args",
]


# ---------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="hutch", description="Self-hostable sandboxes for AI agents.")
    parser.add_argument("--url", help="server URL (default: HUTCH_URL, else the `hutch serve` running on this "
                        "machine's data dir, else the engine inside this process)")
    parser.add_argument(
        "--api-key", help="API key (default: HUTCH_API_KEY, else the local server's key file)"
    )
    parser.add_argument("--org-id", help="the organization to act in (default: the key's own)")
    parser.add_argument("--version", action="version", version="hutch 0.1.0")
    top = parser.add_subparsers(dest="topic", metavar="COMMAND", parser_class=_Parser)
    top.required = True

    # The order of these calls is the order `--help` lists the commands in: what a user runs
    # first, then organizations and keys, then the server and the operator's commands.
    sb = _sandbox.add_parsers(top)
    _sandbox.add_runtime_parser(top)
    _files_jobs.add_parsers(sb)
    _checkpoints.add_parsers(sb)
    _snapshots.add_parsers(sb)
    _history.add_parsers(sb)
    _ssh.add_parsers(top, sb)
    _tenancy.add_parsers(top)
    _serve_parser(top)
    _mcp.add_parsers(top)
    _ops.add_parsers(top)
    _nodes.add_parsers(top)
    return parser


def _serve_parser(top: Any) -> None:
    serve = top.add_parser("serve", help="run a hutch server")
    serve.add_argument("--host", help="listen address (HUTCH_HOST, default 127.0.0.1)")
    serve.add_argument(
        "--port", type=_int_in(0, 65535), help="listen port (HUTCH_PORT, default 8700)"
    )
    serve.add_argument("--data-dir", help="state directory (HUTCH_DATA_DIR)")
    serve.add_argument(
        "--event-log", metavar="URL", help="sqlite | sqlite:///path | kafka://... (HUTCH_EVENT_LOG)"
    )
    serve.add_argument("--store", metavar="URL", help="memory | postgresql://... (HUTCH_STORE)")
    serve.add_argument("--driver", choices=("local", "nomad", "node", "fake"), help="the execution driver (HUTCH_DRIVER)")
    serve.add_argument("--prebuild", nargs="+", metavar="RUNTIME",
                       help="build these catalog runtimes (or 'all') in the background at start, instead of at "
                            "their first use (HUTCH_PREBUILD, comma-separated)")
    serve.add_argument("--ssh-port", type=_int_in(0, 65535), metavar="PORT",
                       help="also run the SSH gateway on this port: ssh -p PORT sbx_…@host (HUTCH_SSH_PORT)")
    serve.add_argument("--e2b-port", type=_int_in(0, 65535), metavar="PORT",
                       help="also serve E2B's wire on this port, for its SDK's E2B_API_URL and E2B_SANDBOX_URL "
                            "(HUTCH_E2B_PORT)")
    serve.add_argument("--e2b-tls-port", type=_int_in(0, 65535), metavar="PORT",
                       help="also serve E2B's wire over TLS on this port, with E2B's host routing: sandboxes at "
                            "{port}-{id}.DOMAIN (HUTCH_E2B_TLS_PORT; needs --e2b-port)")
    serve.add_argument("--e2b-domain", metavar="DOMAIN",
                       help="the domain of the TLS listener's sandbox hosts (HUTCH_E2B_DOMAIN, default "
                            "e2b.localhost); the SDK's E2B_DOMAIN is DOMAIN:PORT")
    serve.set_defaults(handler=cmd_serve)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """argparse, plus: everything after the first ``--`` is the sandbox command, verbatim."""
    argv = list(argv)
    tail: list[str] | None = None
    if "--" in argv:
        cut = argv.index("--")
        argv, tail = argv[:cut], argv[cut + 1 :]
    parser = build_parser()
    args = parser.parse_args(argv)
    needs_command = getattr(args, "needs_command", False)
    command = list(getattr(args, "command", None) or []) + (tail or [])
    if needs_command and not command:
        parser.error("missing the command to run; put it after --, e.g. `hutch run -- echo hi`")
    if not needs_command and tail and not getattr(args, "accepts_command", False):
        parser.error(f"unexpected arguments after --: {' '.join(tail)}")
    args.command = command
    return args


def cmd_serve(args: argparse.Namespace) -> int:
    from hutch.api.app import run_server
    from hutch.service.config import Config

    try:
        config = Config.from_env(
            host=args.host,
            port=args.port,
            data_dir=args.data_dir,
            event_log=args.event_log,
            store=args.store,
            driver=args.driver,
            prebuild=",".join(args.prebuild) if args.prebuild else None,
            ssh_port=args.ssh_port,
            e2b_port=args.e2b_port,
            e2b_tls_port=args.e2b_tls_port,
            e2b_domain=args.e2b_domain,
        )
    except (ValueError, TypeError) as err:
        raise UsageError(f"bad server setting (check HUTCH_* variables): {err}") from err
    from hutch.service.extras import missing_message

    if (missing := missing_message(config)) is not None:
        raise UsageError(missing)
    run_server(config)
    return 0


# ---------------------------------------------------------------- entry point


def _explain(err: HutchError, args: argparse.Namespace) -> str:
    message = err.message
    if isinstance(err, Unauthorized):
        where = _config.data_dir() / _config.API_KEY_FILE
        message += f" (set HUTCH_API_KEY or --api-key; a local server keeps its key in {where})"
    elif isinstance(err, ConnectionFailed) and not _remote_wanted(args):
        message += " (start one with `hutch serve`, or set HUTCH_URL)"
    elif "in use by another hutch server" in message:
        message += "; set HUTCH_URL to use that server, e.g. HUTCH_URL=http://127.0.0.1:8700"
    # The machine code of what the server or the SDK refused; not of the CLI's own failures.
    if err.code and not isinstance(err, ConnectionFailed | _files_jobs.Failure):
        message += f" [{err.code}]"
    return message


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        return int(args.handler(args))
    except UsageError as err:
        sys.stderr.write(f"hutch: error: {err}\n")
        return 2
    except HutchError as err:
        _note(f"error: {_explain(err, args)}")
        return 1
    except KeyboardInterrupt:
        _note("interrupted")
        return 130
    except BrokenPipeError:
        # The reader went away (e.g. `hutch sb ls | head`); nothing left to say.
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), sys.stdout.fileno())
        return 1

    except Exception as err:
        if os.environ.get("HUTCH_DEBUG"):
            raise
        _note(f"internal error: {type(err).__name__}: {err} (set HUTCH_DEBUG=1 for a traceback)")
        return 1
