"""The sandbox commands: ``hutch run``, ``hutch sandbox|sb`` run, create, list, get, delete, exec,
pause, resume, events, execution and runtime, and ``hutch runtime|rt``: their parsers and handlers.

The other ``hutch sandbox`` groups (files, env, jobs, checkpoints, snapshots, history, ssh)
live in their own modules and hang off the subparsers :func:`add_parsers` returns.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from pathlib import Path
from typing import Any, Unpack, get_args

from hutch._stdin import piped_stdin
from hutch.cli import _render as render
from hutch.cli._common import (
    UsageError,
    _command_arg,
    _exit_code,
    _in_process,
    _json_flag,
    _note,
    _out,
    _Parser,
    _remote_wanted,
    _status_note,
    _stderr_sink,
    _stdout_sink,
    _with_client,
)
from hutch.cli._progress import follow_build, follow_in_background
from hutch.cli._values import (  # argparse `type=` parsers
    _int_in,
    cpu_value,
    duration_value,
    env_pair,
    file_pair,
    memory_value,
    metadata_value,
)
from hutch.client import SandboxClient, SandboxOptions
from hutch.errors import ConnectionFailed, SandboxError, Unauthorized
from hutch.models import Network, Resources, SandboxStatus, Timeouts, to_wire

# What `ls --status` filters by: every status the SDK knows but "deleted" (a deleted sandbox is
# not listed), from the one Literal so a new status cannot be missed here.
SANDBOX_STATUSES = tuple(s for s in get_args(SandboxStatus) if s != "deleted")
MODES = ("oneshot", "interactive")
SANDBOX_SORTS = ("name", "created", "updated", "status", "mode", "execution_count")
RUNTIME_SORTS = ("name", "created")
DIRECTIONS = ("asc", "desc")

# How long an in-process `run` waits for its one-shot sandbox to be torn down before exiting.
_ONESHOT_SETTLE_MS = 10_000


# ---------------------------------------------------------------- shared flags


def _sandbox_spec_flags(p: argparse.ArgumentParser) -> None:
    """Flags shared by `run` and `sandbox create`."""
    p.add_argument("--runtime", help="runtime name (default base:latest: a shell and coreutils, no python; "
                   "python:3.13 has python3; `hutch runtime list` shows them all)")
    p.add_argument("--runtime-id", help="runtime id (srt_...)")
    p.add_argument("--snapshot", help="create from a snapshot id or tag")
    p.add_argument("--memory", type=memory_value, help="memory limit, e.g. 512Mi, 1Gi")
    p.add_argument("--cpu", type=cpu_value, help="cpu limit, e.g. 500m, 1")
    p.add_argument("--disk", type=memory_value, help="disk limit, e.g. 1Gi")
    p.add_argument("--network", action="store_true", help="enable outbound network access")
    p.add_argument("--allow", action="append", default=[], metavar="HOST_OR_CIDR",
                   help="limit --network to this destination (repeatable; names are kept resolved)")
    p.add_argument("--deny", action="append", default=[], metavar="IPV4_OR_CIDR",
                   help="keep --network from this address or CIDR (repeatable; not with --allow)")
    p.add_argument(
        "--env", type=env_pair, action="append", default=[], metavar="KEY=VALUE", help="repeatable"
    )
    p.add_argument(
        "--file",
        type=file_pair,
        action="append",
        default=[],
        metavar="SANDBOX_PATH:LOCAL_PATH",
        help="repeatable",
    )
    p.add_argument(
        "--dependency",
        action="append",
        default=[],
        metavar="PACKAGE",
        help="apt package (repeatable)",
    )
    p.add_argument(
        "--package",
        action="append",
        default=[],
        metavar="NPM_PACKAGE",
        help="npm package installed globally, e.g. typescript or zod@3 (repeatable; hutch's own)",
    )
    p.add_argument("--scope", action="append", default=[], help="permission scope (repeatable)")
    p.add_argument("--project-id", help="associate with a project")
    p.add_argument("--org-id", default=argparse.SUPPRESS, help="the organization to act in (default: the key's own)")


def _run_flags(p: argparse.ArgumentParser) -> None:
    _sandbox_spec_flags(p)
    p.add_argument("--timeout", type=duration_value, help="execution timeout, e.g. 30s, 5m")
    p.add_argument("--quiet", action="store_true", help="do not stream the command's output")
    p.add_argument(
        "--timestamps", action="store_true", help="ask the server to timestamp output lines"
    )
    p.add_argument("--no-stdin", action="store_true",
                   help="do not send this process's stdin (sent when piped or redirected)")
    p.add_argument(
        "--data-dir", help="in-process only: the engine's data dir (default: HUTCH_DATA_DIR)"
    )
    p.add_argument(
        "--driver", choices=("local", "nomad", "node", "fake"),
        help="in-process only: execution driver (default: HUTCH_DRIVER or local)",
    )
    _json_flag(p)
    _command_arg(p)
    p.set_defaults(handler=cmd_run, needs_command=True)


def _runtime_commands(runtime: argparse.ArgumentParser) -> None:
    rt = runtime.add_subparsers(dest="runtime_action", metavar="ACTION", parser_class=_Parser)
    rt.required = True
    rt_list = rt.add_parser("list", aliases=["ls"], help="list runtimes")
    rt_list.add_argument("--limit", type=_int_in(1, 100))
    rt_list.add_argument("--offset", type=_int_in(0, None))
    rt_list.add_argument("--sort", choices=RUNTIME_SORTS)
    rt_list.add_argument("--direction", choices=DIRECTIONS)
    _json_flag(rt_list)
    rt_list.set_defaults(handler=cmd_runtime_list)
    rt_build = rt.add_parser("build", help="build runtimes on this host (cached by recipe hash)")
    rt_build.add_argument("names", nargs="*", metavar="NAME", help="catalog names, e.g. python:3.14 bun:1")
    rt_build.add_argument("--all", action="store_true", help="every runtime in the catalog")
    rt_build.add_argument("--force", action="store_true", help="rebuild even when cached")
    rt_build.add_argument("--verbose", "-v", action="store_true", help="print the builders' output")
    rt_build.add_argument("--cache", type=Path, help="cache dir (HUTCH_RUNTIME_CACHE, else /var/cache/hutch/runtimes)")
    rt_build.set_defaults(handler=cmd_runtime_build, json=False)


# ---------------------------------------------------------------- parsers


def add_parsers(top: Any) -> Any:
    """``hutch run`` and ``hutch sandbox|sb`` with its own actions; returns the sandbox
    subparsers, for the other modules' groups."""
    _run_flags(top.add_parser("run", help="run one command in a fresh sandbox"))

    sandbox = top.add_parser("sandbox", aliases=["sb"], help="manage sandboxes")
    sb = sandbox.add_subparsers(dest="action", metavar="ACTION", parser_class=_Parser)
    sb.required = True

    _run_flags(sb.add_parser("run", help="run one command in a fresh sandbox"))
    _create_parser(sb)
    _list_parser(sb)
    _get_delete_parsers(sb)
    _exec_parser(sb)
    _pause_resume_events_parsers(sb)
    _network_parser(sb)
    _execution_parsers(sb)
    _runtime_commands(sb.add_parser("runtime", aliases=["rt"], help="available runtimes"))
    return sb


def add_runtime_parser(top: Any) -> None:
    """``hutch runtime|rt``: the catalog, and building runtimes on this host."""
    _runtime_commands(top.add_parser("runtime", aliases=["rt"], help="list and build runtimes"))


def _create_parser(sb: Any) -> None:
    create = sb.add_parser("create", aliases=["new"], help="create an interactive sandbox")
    _sandbox_spec_flags(create)
    create.add_argument("--name", help="sandbox name")
    create.add_argument("--description", help="sandbox description")
    create.add_argument("--port", type=_int_in(1024, 65535), help="port to expose (1024-65535)")
    create.add_argument(
        "--idle-timeout", type=duration_value, help="destroy after this long idle, e.g. 1h"
    )
    create.add_argument("--timeout", type=duration_value, help="default execution timeout, e.g. 5m")
    create.add_argument(
        "--paused-timeout", type=duration_value, help="terminate after paused this long; 0s = never"
    )
    create.add_argument("--metadata", type=metadata_value, help="user metadata as a JSON object")
    _json_flag(create)
    create.set_defaults(handler=cmd_create)


def _list_parser(sb: Any) -> None:
    ls = sb.add_parser("list", aliases=["ls"], help="list sandboxes")
    ls.add_argument("--status", choices=SANDBOX_STATUSES)
    ls.add_argument("--name")
    ls.add_argument("--mode", choices=MODES)
    ls.add_argument("--project-id")
    ls.add_argument("--org-id", default=argparse.SUPPRESS, help="the organization to act in (default: the key's own)")
    ls.add_argument(
        "--all",
        action="store_true",
        help="accepted for compatibility (hutch has no project filter)",
    )
    ls.add_argument("--limit", type=_int_in(1, 100), help="max results (default 50, max 100)")
    ls.add_argument("--offset", type=_int_in(0, None))
    ls.add_argument("--sort", choices=SANDBOX_SORTS)
    ls.add_argument("--direction", choices=DIRECTIONS)
    _json_flag(ls)
    ls.set_defaults(handler=cmd_list)


def _get_delete_parsers(sb: Any) -> None:
    get = sb.add_parser("get", aliases=["show", "info"], help="show a sandbox")
    get.add_argument("sandbox_id", metavar="SANDBOX_ID")
    _json_flag(get)
    get.set_defaults(handler=cmd_get)

    delete = sb.add_parser(
        "delete", aliases=["rm", "del", "remove", "destroy", "terminate"], help="destroy sandboxes"
    )
    delete.add_argument("sandbox_ids", nargs="+", metavar="SANDBOX_ID")
    delete.add_argument("--confirm", action="store_true", help="do not ask")
    _json_flag(delete)
    delete.set_defaults(handler=cmd_delete)


def _exec_parser(sb: Any) -> None:
    exec_ = sb.add_parser("exec", help="run a command in an existing sandbox")
    exec_.add_argument("sandbox_id", metavar="SANDBOX_ID")
    exec_.add_argument("--timeout", type=duration_value, help="execution timeout, e.g. 5m")
    exec_.add_argument("--quiet", action="store_true", help="do not stream the command's output")
    exec_.add_argument(
        "--timestamps", action="store_true", help="ask the server to timestamp output lines"
    )
    exec_.add_argument("--no-stdin", action="store_true",
                       help="do not send this process's stdin (sent when piped or redirected)")
    _json_flag(exec_)
    _command_arg(exec_)
    exec_.set_defaults(handler=cmd_exec, needs_command=True)


def _pause_resume_events_parsers(sb: Any) -> None:
    for name, handler in (("pause", cmd_pause), ("resume", cmd_resume)):
        p = sb.add_parser(
            name, aliases=["hibernate"] if name == "pause" else ["wake"], help=f"{name} a sandbox"
        )
        p.add_argument("sandbox_id", metavar="SANDBOX_ID")
        if name == "pause":
            p.add_argument("--filesystem", action="store_true",
                           help="filesystem-only: end every process and keep the files; the resume boots it again")
        _json_flag(p)
        p.set_defaults(handler=handler)

    events = sb.add_parser("events", help="list a sandbox's lifecycle events")
    events.add_argument("sandbox_id", metavar="SANDBOX_ID")
    events.add_argument("--limit", type=_int_in(1, 100), help="max results (default 50, max 100)")
    events.add_argument("--reverse", action="store_true", help="newest first")
    _json_flag(events)
    events.set_defaults(handler=cmd_events)


def _network_parser(sb: Any) -> None:
    net = sb.add_parser("network", help="replace a running sandbox's egress rules")
    net.add_argument("sandbox_id", metavar="SANDBOX_ID")
    net.add_argument("--off", action="store_true", help="no outbound network")
    net.add_argument("--allow", action="append", default=[], metavar="HOST_OR_CIDR",
                     help="only this destination (repeatable; names are kept resolved)")
    net.add_argument("--deny", action="append", default=[], metavar="IPV4_OR_CIDR",
                     help="all but this address or CIDR (repeatable; not with --allow)")
    _json_flag(net)
    net.set_defaults(handler=cmd_network)


def _execution_parsers(sb: Any) -> None:
    execution = sb.add_parser("execution", help="execution history")
    ex = execution.add_subparsers(dest="execution_action", metavar="ACTION", parser_class=_Parser)
    ex.required = True
    ex_list = ex.add_parser("list", aliases=["ls"], help="a sandbox's executions")
    ex_list.add_argument("sandbox_id", metavar="SANDBOX_ID")
    ex_list.add_argument("--limit", type=_int_in(1, 100))
    _json_flag(ex_list)
    ex_list.set_defaults(handler=cmd_execution_list)
    ex_get = ex.add_parser("get", aliases=["show", "info"], help="one execution")
    ex_get.add_argument("execution_id", metavar="EXECUTION_ID")
    _json_flag(ex_get)
    ex_get.set_defaults(handler=cmd_execution_get)
    ex_cancel = ex.add_parser("cancel", aliases=["kill", "stop"], help="end a running command's whole process tree")
    ex_cancel.add_argument("execution_id", metavar="EXECUTION_ID")
    _json_flag(ex_cancel)
    ex_cancel.set_defaults(handler=cmd_execution_get, cancel=True)


# ---------------------------------------------------------------- commands


def _spec(args: argparse.Namespace, **more: Unpack[SandboxOptions]) -> SandboxOptions:
    """The sandbox options ``run`` and ``create`` share, plus ``more``."""
    resources = Resources(memory=args.memory, cpu=args.cpu, disk=args.disk)
    spec: SandboxOptions = {
        "runtime": args.runtime,
        "runtime_id": args.runtime_id,
        "snapshot": args.snapshot,
        "resources": resources if resources != Resources() else None,
        "env": dict(args.env) or None,
        "files": args.file or None,
        "dependencies": args.dependency or None,
        "packages": args.package or None,
        "scopes": args.scope or None,
        "project_id": args.project_id,
    }
    spec.update(more)
    return spec


def _network(args: argparse.Namespace) -> Network | None:
    """--network, --port (create only) and --allow as the wire's network object."""
    port = getattr(args, "port", None)
    if not (args.network or port is not None or args.allow or args.deny):
        return None
    return Network(enabled=True if args.network else None, port=port, allow=args.allow or None,
                   deny=args.deny or None)


def cmd_run(args: argparse.Namespace) -> int:
    if _remote_wanted(args) and (args.data_dir or args.driver):
        raise UsageError(
            "--data-dir and --driver apply only in-process; unset HUTCH_URL/--url to use them"
        )
    stream_output = not (args.quiet or args.json)

    in_process = not _remote_wanted(args)

    async def work(client: SandboxClient) -> Any:
        on_created, finish_following = follow_in_background(client, _note)
        try:
            result = await client.run(
                args.command,
                **_spec(args, network=_network(args), timeout=args.timeout),
                stream={"timestamps": True} if args.timestamps else None,
                stdout=_stdout_sink() if stream_output else None,
                stderr=_stderr_sink() if stream_output else None,
                on_created=on_created if not args.json else None,
                stdin=None if args.no_stdin else piped_stdin(),
            )
        finally:
            await finish_following()
        if in_process:
            # The engine dies with this process: let it finish tearing the one-shot sandbox
            # down (the driver's destroy) before shutting it down.
            with contextlib.suppress(SandboxError):
                await client.get(
                    result.sandbox_id,
                    wait_for_status=["terminated", "failed"],
                    wait_ms=_ONESHOT_SETTLE_MS,
                )
        return result

    runner = _in_process if in_process else _with_client
    result = asyncio.run(runner(args, work))
    if args.json:
        render.dump_json(
            {
                "sandboxId": result.sandbox_id,
                "executionId": result.execution_id,
                "status": result.status,
                "exitCode": result.exit_code,
                "durationMs": result.duration_ms,
                "stdout": result.stdout,
                "stderr": result.stderr,
                "outputTruncated": bool(result.output_truncated),
                "error": result.error,
            },
            _out(),
        )
    else:
        _status_note(result.status, result.output_truncated, result.error)
    return _exit_code(result.exit_code)


def cmd_exec(args: argparse.Namespace) -> int:
    stream_output = not (args.quiet or args.json)

    async def work(client: SandboxClient) -> Any:
        sandbox = await client.connect(args.sandbox_id)
        return await sandbox.execute(
            args.command,
            timeout=args.timeout,
            stdout=_stdout_sink() if stream_output else None,
            stderr=_stderr_sink() if stream_output else None,
            capture=args.json,
            stream={"timestamps": True} if args.timestamps else None,
            stdin=None if args.no_stdin else piped_stdin(),
        )

    execution = asyncio.run(_with_client(args, work))
    if args.json:
        render.dump_json(to_wire(execution), _out())
    else:
        _status_note(execution.status, execution.output_truncated, execution.error)
    return _exit_code(execution.exit_code)


def cmd_create(args: argparse.Namespace) -> int:
    network = _network(args)
    timeouts = Timeouts(idle=args.idle_timeout, execution=args.timeout, paused=args.paused_timeout)

    async def work(client: SandboxClient) -> Any:
        sandbox = await client.create(
            **_spec(
                args,
                name=args.name,
                description=args.description,
                network=network,
                timeout=timeouts if timeouts != Timeouts() else None,
                metadata=args.metadata,
            )
        )
        if sandbox.status == "creating" and not args.json:  # its runtime is built first
            _note(f"sandbox {sandbox.id}: the runtime is not built on the server yet: building it first")
            await follow_build(client, sandbox.id, _note)
            sandbox = await client.connect(sandbox.id)
        return sandbox

    sandbox = asyncio.run(_with_client(args, work))
    if args.json:
        assert sandbox.created is not None
        render.dump_json(to_wire(sandbox.created), _out())
    else:
        _out().write(f"{sandbox.id}\n")
        _note(f"created sandbox {sandbox.id} (status: {sandbox.status})")
        if sandbox.url:
            _note(f"url: {sandbox.url}")
        if sandbox.status == "failed":
            return 1
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    page = asyncio.run(
        _with_client(
            args,
            lambda c: c.list(
                status=args.status,
                name=args.name,
                mode=args.mode,
                project_id=args.project_id,
                limit=args.limit,
                offset=args.offset,
                sort=args.sort,
                direction=args.direction,
            ),
        )
    )
    if args.json:
        render.dump_json(to_wire(page), _out())
    else:
        render.sandboxes(page.sandboxes, page.total, _out())
    return 0


def cmd_get(args: argparse.Namespace) -> int:
    info = asyncio.run(_with_client(args, lambda c: c.get(args.sandbox_id)))
    if args.json:
        render.dump_json(to_wire(info), _out())
    else:
        render.sandbox(info, _out())
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    if not args.confirm and sys.stdin.isatty() and not args.json:
        answer = input(f"Destroy {', '.join(args.sandbox_ids)}? [y/N] ").strip().lower()
        if answer not in ("y", "yes"):
            _note("nothing deleted")
            return 1

    async def work(client: SandboxClient) -> list[tuple[str, SandboxError | None]]:
        outcome: list[tuple[str, SandboxError | None]] = []
        for sandbox_id in args.sandbox_ids:
            try:
                await client.destroy(sandbox_id)
                outcome.append((sandbox_id, None))
            except (ConnectionFailed, Unauthorized):
                raise
            except SandboxError as err:
                outcome.append((sandbox_id, err))
        return outcome

    outcome = asyncio.run(_with_client(args, work))
    if args.json:
        items = [
            {
                "sandboxId": sid,
                "success": err is None,
                **({"message": err.message, "code": err.code} if err else {}),
            }
            for sid, err in outcome
        ]
        render.dump_json(items[0] if len(items) == 1 else items, _out())
    for sid, err in outcome:
        if err is not None:
            _note(f"{sid}: {err.message}")
        elif not args.json:
            _out().write(f"deleted {sid}\n")
    return 0 if all(err is None for _, err in outcome) else 1


def cmd_pause(args: argparse.Namespace) -> int:
    result = asyncio.run(_with_client(args, lambda c: c.pause(args.sandbox_id, memory=not args.filesystem)))
    if args.json:
        render.dump_json(to_wire(result), _out())
    else:
        how = ", filesystem only" if result.memory is False else ""
        _out().write(f"paused {result.sandbox_id} (status: {result.status}{how})\n")
        if result.terminates_at:
            _note(f"terminates at {result.terminates_at} unless resumed")
    return 0


def cmd_network(args: argparse.Namespace) -> int:
    """Neither list nor --off: the network the sandbox was made with, unrestricted."""
    if args.off and (args.allow or args.deny):
        raise UsageError("--off takes no --allow or --deny: a network turned off has no lists")
    info = asyncio.run(_with_client(args, lambda c: c.update_network(
        args.sandbox_id, enabled=not args.off, allow=args.allow or None, deny=args.deny or None)))
    if args.json:
        render.dump_json(to_wire(info), _out())
    elif not info.network_enabled:
        _out().write(f"{info.sandbox_id}: network off\n")
    elif info.network_allow:
        _out().write(f"{info.sandbox_id}: network limited to {', '.join(info.network_allow)}\n")
    elif info.network_deny:
        _out().write(f"{info.sandbox_id}: network without {', '.join(info.network_deny)}\n")
    else:
        _out().write(f"{info.sandbox_id}: network unrestricted\n")
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    asyncio.run(_with_client(args, lambda c: c.resume(args.sandbox_id)))
    if args.json:
        render.dump_json({"sandboxId": args.sandbox_id, "success": True}, _out())
    else:
        _out().write(f"resumed {args.sandbox_id}\n")
    return 0


def cmd_events(args: argparse.Namespace) -> int:
    events = asyncio.run(
        _with_client(
            args,
            lambda c: c.list_events(
                args.sandbox_id, limit=args.limit, direction="desc" if args.reverse else "asc"
            ),
        )
    )
    if args.json:
        render.dump_json({"events": to_wire(events)}, _out())
    else:
        render.events(events, _out())
    return 0


def cmd_execution_list(args: argparse.Namespace) -> int:
    items = asyncio.run(
        _with_client(args, lambda c: c.list_executions(args.sandbox_id, limit=args.limit))
    )
    if args.json:
        render.dump_json({"executions": to_wire(items)}, _out())
    else:
        render.executions(items, _out())
    return 0


def cmd_execution_get(args: argparse.Namespace) -> int:
    """``execution get``, and ``execution cancel`` (which shows the execution it ended)."""
    call = "cancel_execution" if getattr(args, "cancel", False) else "get_execution"
    info = asyncio.run(_with_client(args, lambda c: getattr(c, call)(args.execution_id)))
    if args.json:
        render.dump_json(to_wire(info), _out())
    else:
        render.execution(info, _out())
    return 0


def cmd_runtime_list(args: argparse.Namespace) -> int:
    page = asyncio.run(
        _with_client(
            args,
            lambda c: c.list_runtimes(
                limit=args.limit, offset=args.offset, sort=args.sort, direction=args.direction
            ),
        )
    )
    if args.json:
        render.dump_json(to_wire(page), _out())
    else:
        render.runtimes(page.runtimes, page.total, _out())
    return 0


def cmd_runtime_build(args: argparse.Namespace) -> int:
    from hutch.cli import _runtime_build  # imports the builder (drivers.local) only here

    return _runtime_build.run(args, _out())

