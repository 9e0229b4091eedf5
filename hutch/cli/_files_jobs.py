"""`hutch sandbox fs|files|file …`, `hutch sandbox env …` and `hutch sandbox job …`.

Kept apart from ``hutch/cli/_sandbox.py``; :func:`add_parsers` hangs these commands
under ``hutch sandbox``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from hutch.cli import _render as render
from hutch.cli._common import (
    UsageError,
    _command_arg,
    _json_flag,
    _note,
    _out,
    _Parser,
    _stderr_sink,
    _stdout_sink,
    _with_client,
)
from hutch.cli._values import _int_in, duration_value, env_pair
from hutch.client import ARCHIVE_FORMATS, SandboxClient
from hutch.core.errors import HutchError
from hutch.core.quantities import parse_duration
from hutch.handles import JobHandle
from hutch.models import to_wire

T = TypeVar("T")

#: ``sbx_…:/path`` — the sandbox side of `fs cp`.
_REMOTE = re.compile(r"^(sbx_[A-Za-z0-9_-]+):(.*)$", re.S)


class Failure(HutchError):
    """The command ran but did not succeed: message on stderr, exit 1."""

    code = "CLI_FAILURE"


# ---------------------------------------------------------------- parsers


def add_parsers(sb: Any) -> None:
    _files_parsers(sb)

    env = sb.add_parser(
        "env",
        help="set or delete a sandbox's environment variables",
        description="Set KEY=VALUE pairs and delete keys (-d); prints the sandbox's whole "
        "environment afterwards. With no arguments, prints it unchanged.",
    )
    env.add_argument("sandbox_id", metavar="SANDBOX_ID")
    env.add_argument(
        "assignments", nargs="*", type=env_pair, metavar="KEY=VALUE", help="variables to set"
    )
    env.add_argument(
        "-d", "--delete", action="append", default=[], metavar="KEY", help="delete (repeatable)"
    )
    _json_flag(env)
    env.set_defaults(handler=cmd_env)

    job = sb.add_parser("job", help="background jobs")
    jb = job.add_subparsers(dest="job_action", metavar="ACTION", parser_class=_Parser)
    jb.required = True
    create = jb.add_parser("create", aliases=["new"], help="start a background job: job create ID -- CMD ...")
    create.add_argument("sandbox_id", metavar="SANDBOX_ID")
    _json_flag(create)
    _command_arg(create)
    create.set_defaults(handler=cmd_job_create, needs_command=True)
    ls = jb.add_parser("list", aliases=["ls"], help="a sandbox's jobs")
    ls.add_argument("sandbox_id", metavar="SANDBOX_ID")
    ls.add_argument("--limit", type=_int_in(1, 1000), help="max results (default 50)")
    _json_flag(ls)
    ls.set_defaults(handler=cmd_job_list)
    get = jb.add_parser(
        "get", aliases=["show", "info"], help="status, exit code, times and stream URLs"
    )
    get.add_argument("sandbox_id", metavar="SANDBOX_ID")
    get.add_argument("job_id", metavar="JOB_ID")
    _json_flag(get)
    get.set_defaults(handler=cmd_job_get)
    logs = jb.add_parser("logs", aliases=["output"],
                         help="a job's stdout and stderr so far (-f: follow until the job ends)")
    logs.add_argument("sandbox_id", metavar="SANDBOX_ID")
    logs.add_argument("job_id", metavar="JOB_ID")
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing until the job ends")
    logs.set_defaults(handler=cmd_job_logs)
    stop = jb.add_parser("destroy", aliases=["stop"], help="stop a job (SIGTERM, then SIGKILL)")
    stop.add_argument("sandbox_id", metavar="SANDBOX_ID")
    stop.add_argument("job_id", metavar="JOB_ID")
    stop.add_argument("--force", action="store_true", help="SIGKILL at once instead of SIGTERM")
    _json_flag(stop)
    stop.set_defaults(handler=cmd_job_destroy)


def _files_parsers(sb: Any) -> None:
    fs = sb.add_parser("fs", aliases=["files", "file"], help="files in a sandbox")
    fsp = fs.add_subparsers(dest="fs_action", metavar="ACTION", parser_class=_Parser)
    fsp.required = True

    cp = fsp.add_parser(
        "cp",
        help="copy files to/from a sandbox (SANDBOX_ID:PATH on one side)",
        description="Copy a file or (with -r) a directory between this machine and a sandbox; "
        "write the sandbox side as SANDBOX_ID:PATH. Missing parent directories are created "
        "(see directoriesCreated in --json) unless --strict. A destination that is an existing "
        "directory, or ends in '/', receives the source under its own name.",
    )
    cp.add_argument("source", metavar="SOURCE")
    cp.add_argument("destination", metavar="DESTINATION")
    cp.add_argument("-r", "--recursive", action="store_true", help="copy directories recursively")
    cp.add_argument(
        "--strict",
        action="store_true",
        help="fail if the target's parent directory does not exist (no auto-creation)",
    )
    cp.add_argument("--timeout", type=duration_value, help="operation timeout, e.g. 5m")
    _json_flag(cp)
    cp.set_defaults(handler=cmd_fs_cp)

    ls = fsp.add_parser("ls", aliases=["list"], help="list files")
    ls.add_argument("sandbox_id", metavar="SANDBOX_ID")
    ls.add_argument("path", nargs="?", metavar="PATH", help="default: the workspace")
    ls.add_argument("-l", "--long", action="store_true", help="show permissions, sizes and times")
    _json_flag(ls)
    ls.set_defaults(handler=cmd_fs_ls)

    mkdir = fsp.add_parser("mkdir", help="create a directory")
    mkdir.add_argument("sandbox_id", metavar="SANDBOX_ID")
    mkdir.add_argument("path", metavar="PATH")
    mkdir.add_argument("-p", "--parents", action="store_true", help="create parents as needed")
    _json_flag(mkdir)
    mkdir.set_defaults(handler=cmd_fs_mkdir)

    rm = fsp.add_parser("rm", help="remove a file")
    rm.add_argument("sandbox_id", metavar="SANDBOX_ID")
    rm.add_argument("path", metavar="PATH")
    rm.add_argument("-f", "--force", action="store_true", help="no error if it does not exist")
    _json_flag(rm)
    rm.set_defaults(handler=cmd_fs_rm)

    rmdir = fsp.add_parser("rmdir", help="remove a directory (-r for a non-empty one)")
    rmdir.add_argument("sandbox_id", metavar="SANDBOX_ID")
    rmdir.add_argument("path", metavar="PATH")
    rmdir.add_argument("-r", "--recursive", action="store_true", help="remove its contents too")
    rmdir.add_argument("-f", "--force", action="store_true", help="no error if it does not exist")
    _json_flag(rmdir)
    rmdir.set_defaults(handler=cmd_fs_rmdir)
    _archive_parsers(fsp)


def _archive_parsers(fsp: Any) -> None:
    """``fs download|dl`` and ``fs upload|ul``: whole trees as one archive."""
    dl = fsp.add_parser("download", aliases=["dl"], help="download files as an archive")
    dl.add_argument("sandbox_id", metavar="SANDBOX_ID")
    dl.add_argument("output", metavar="OUTPUT_FILE", help="archive to write ('-' for stdout)")
    dl.add_argument("--path", help="directory to download (default: the workspace)")
    dl.add_argument(
        "--format",
        choices=ARCHIVE_FORMATS,
        help="tar.gz (default), zip or tar; a .zip or .tar OUTPUT_FILE picks that format",
    )
    dl.add_argument("--timeout", type=duration_value, help="operation timeout, e.g. 5m")
    _json_flag(dl)
    dl.set_defaults(handler=cmd_fs_download)

    ul = fsp.add_parser("upload", aliases=["ul"], help="upload and extract an archive")
    ul.add_argument("sandbox_id", metavar="SANDBOX_ID")
    ul.add_argument("archive", metavar="ARCHIVE_FILE", help="tar.gz, tar or zip ('-' for stdin)")
    ul.add_argument("--path", help="destination directory (default: the workspace)")
    ul.add_argument(
        "--format", choices=(*ARCHIVE_FORMATS, "tgz"), help="archive format (default: detected)"
    )
    ul.add_argument("--timeout", type=duration_value, help="operation timeout, e.g. 5m")
    _json_flag(ul)
    ul.set_defaults(handler=cmd_fs_upload)


# ---------------------------------------------------------------- plumbing


def _run(args: argparse.Namespace, work: Callable[[SandboxClient], Awaitable[T]]) -> T:
    """Run ``work`` with a client, bounded by ``--timeout`` when the command has one."""
    limit = getattr(args, "timeout", None)
    if not limit:
        return asyncio.run(_with_client(args, work))
    seconds = parse_duration("--timeout", limit)

    async def bounded(client: SandboxClient) -> T:
        async with asyncio.timeout(seconds):
            return await work(client)

    try:
        return asyncio.run(_with_client(args, bounded))
    except TimeoutError:
        raise Failure(f"gave up after {limit} (--timeout {limit})") from None


def _remote(text: str) -> tuple[str, str] | None:
    match = _REMOTE.match(text)
    return (match[1], match[2]) if match else None


def _local_exists(path: str, what: str) -> None:
    if path != "-" and not os.path.exists(os.path.expanduser(path)):
        raise UsageError(f"{what} {path!r}: no such file or directory")


# ---------------------------------------------------------------- fs


def cmd_fs_cp(args: argparse.Namespace) -> int:
    src, dst = _remote(args.source), _remote(args.destination)
    if src and dst:
        raise UsageError("fs cp: both sides are sandbox paths; one of them must be a local path")
    if not src and not dst:
        raise UsageError(
            "fs cp: one side must be a sandbox path written SANDBOX_ID:PATH, "
            "e.g. sbx_abc123:/home/agentuity/file.txt"
        )
    if dst:
        _local_exists(args.source, "SOURCE")

    async def work(client: SandboxClient) -> Any:
        if dst:
            return await client.copy_to(
                dst[0], args.source, dst[1] or ".", recursive=args.recursive, strict=args.strict
            )
        assert src is not None
        return await client.copy_from(
            src[0], src[1] or ".", args.destination, recursive=args.recursive, strict=args.strict
        )

    result = _run(args, work)
    if args.json:
        render.dump_json(
            {
                "source": args.source,
                "destination": args.destination,
                "bytesTransferred": result.bytes_transferred,
                "filesTransferred": result.files_transferred,
                "directoriesCreated": result.directories_created,
            },
            _out(),
        )
    else:
        files = result.files_transferred
        _out().write(
            f"copied {files} file{'s' if files != 1 else ''} ({result.bytes_transferred} bytes): "
            f"{args.source} -> {args.destination}\n"
        )
        for d in result.directories_created:
            _note(f"created directory {d}")
    return 0


def cmd_fs_ls(args: argparse.Namespace) -> int:
    items = _run(args, lambda c: c.list_files(args.sandbox_id, args.path))
    if args.json:
        render.dump_json({"files": to_wire(items)}, _out())
    else:
        render.files(items, _out(), long=args.long)
    return 0


def cmd_fs_mkdir(args: argparse.Namespace) -> int:
    _run(args, lambda c: c.mkdir(args.sandbox_id, args.path, recursive=args.parents))
    if args.json:
        render.dump_json({"sandboxId": args.sandbox_id, "path": args.path, "success": True}, _out())
    else:
        _out().write(f"created {args.path}\n")
    return 0


def _removed(args: argparse.Namespace, found: bool, what: str) -> int:
    if args.json:
        render.dump_json({"sandboxId": args.sandbox_id, "path": args.path, "found": found}, _out())
    elif found:
        _out().write(f"removed {args.path}\n")
    if not found and not args.force:
        _note(f"error: {what} {args.path!r} does not exist in {args.sandbox_id} (-f to ignore)")
        return 1
    return 0


def cmd_fs_rm(args: argparse.Namespace) -> int:
    found = _run(args, lambda c: c.rm_file(args.sandbox_id, args.path))
    return _removed(args, found, "file")


def cmd_fs_rmdir(args: argparse.Namespace) -> int:
    found = _run(args, lambda c: c.rm_dir(args.sandbox_id, args.path, recursive=args.recursive))
    return _removed(args, found, "directory")


def _format_for(output: str, given: str | None) -> str:
    if given:
        return given
    lowered = output.lower()
    if lowered.endswith(".zip"):
        return "zip"
    if lowered.endswith(".tar"):
        return "tar"
    return "tar.gz"


def cmd_fs_download(args: argparse.Namespace) -> int:
    fmt = _format_for(args.output, args.format)
    to_stdout = args.output == "-"
    if to_stdout and args.json:
        raise UsageError("--json cannot be used with OUTPUT_FILE '-' (the archive goes to stdout)")
    if not to_stdout:
        parent = Path(args.output).expanduser().parent
        if not parent.is_dir():
            raise UsageError(f"OUTPUT_FILE {args.output!r}: directory {str(parent)!r} does not exist")

    target = Path(os.path.expanduser(args.output))

    async def work(client: SandboxClient) -> int:
        if to_stdout:
            sys.stdout.flush()
            return await client.download_archive(
                args.sandbox_id, sys.stdout.buffer, path=args.path, format=fmt
            )
        return await client.download_archive(
            args.sandbox_id, target, path=args.path, format=fmt
        )

    size = _run(args, work)
    if args.json:
        render.dump_json(
            {
                "sandboxId": args.sandbox_id,
                "path": args.path or ".",
                "output": args.output,
                "format": fmt,
                "bytes": size,
            },
            _out(),
        )
    elif not to_stdout:
        _out().write(f"downloaded {size} bytes ({fmt}) to {args.output}\n")
    return 0


def cmd_fs_upload(args: argparse.Namespace) -> int:
    _local_exists(args.archive, "ARCHIVE_FILE")
    if args.archive != "-" and os.path.isdir(os.path.expanduser(args.archive)):
        raise UsageError(
            f"ARCHIVE_FILE {args.archive!r} is a directory; use `fs cp -r` to copy a directory"
        )
    source: Any = sys.stdin.buffer if args.archive == "-" else Path(args.archive).expanduser()
    result = _run(
        args,
        lambda c: c.upload_archive(args.sandbox_id, source, path=args.path, format=args.format),
    )
    if args.json:
        render.dump_json(
            {"sandboxId": args.sandbox_id, "path": args.path or ".", **to_wire(result)}, _out()
        )
    else:
        _out().write(
            f"extracted {result.files} files, {result.directories} directories "
            f"({result.bytes} bytes) into {args.path or 'the workspace'}\n"
        )
    return 0


# ---------------------------------------------------------------- env


def cmd_env(args: argparse.Namespace) -> int:
    changes: dict[str, str | None] = dict(args.assignments)
    for key in args.delete:
        if not key or "=" in key:
            raise UsageError(f"--delete {key!r}: expected a variable name (no '=')")
        if key in changes:
            raise UsageError(f"--delete {key!r}: the same variable is also being set")
        changes[key] = None
    env = _run(args, lambda c: c.set_env(args.sandbox_id, changes))
    if args.json:
        render.dump_json({"sandboxId": args.sandbox_id, "env": env}, _out())
    else:
        for key in sorted(env):
            _out().write(f"{key}={env[key]}\n")
    return 0


# ---------------------------------------------------------------- jobs


def cmd_job_create(args: argparse.Namespace) -> int:
    handle = _run(args, lambda c: c.create_job(args.sandbox_id, args.command))
    if args.json:
        render.dump_json(to_wire(handle.job), _out())
    else:
        _out().write(f"{handle.id}\n")
        _note(f"started job {handle.id} in {args.sandbox_id} (status: {handle.status})")
    return 0


def cmd_job_list(args: argparse.Namespace) -> int:
    jobs = _run(args, lambda c: c.list_jobs(args.sandbox_id, limit=args.limit))
    if args.json:
        render.dump_json({"jobs": to_wire(jobs)}, _out())
    else:
        render.jobs(jobs, _out())
    return 0


def cmd_job_get(args: argparse.Namespace) -> int:
    job = _run(args, lambda c: c.get_job(args.sandbox_id, args.job_id))
    if args.json:
        render.dump_json(to_wire(job), _out())
    else:
        render.job(job, _out())
    return 0


# Without --follow: the output streams carry no "now" mark, so "so far" is what arrives before
# the streams fall quiet for this long (a finished job's streams simply end).
_QUIET_SECONDS = 1.0


def cmd_job_logs(args: argparse.Namespace) -> int:
    """stdout to stdout, stderr to stderr, as they were written."""

    async def work(client: SandboxClient) -> None:
        handle = JobHandle(client, await client.get_job(args.sandbox_id, args.job_id))
        chunks = handle.output().__aiter__()
        sinks = {"stdout": _stdout_sink(), "stderr": _stderr_sink()}
        while True:
            try:
                chunk = await (chunks.__anext__() if args.follow
                               else asyncio.wait_for(chunks.__anext__(), _QUIET_SECONDS))
            except (StopAsyncIteration, TimeoutError):
                break
            sinks[chunk.stream].write(chunk.data)
            sinks[chunk.stream].flush()
        await chunks.aclose()  # type: ignore[attr-defined]

    _run(args, work)
    return 0


def cmd_job_destroy(args: argparse.Namespace) -> int:
    job = _run(args, lambda c: c.stop_job(args.sandbox_id, args.job_id, force=args.force))
    if args.json:
        render.dump_json(to_wire(job), _out())
    else:
        _out().write(f"stopped job {job.job_id} (status: {job.status})\n")
    return 0
