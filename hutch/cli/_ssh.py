"""`hutch ssh-key add|list|remove`: the keys of the SSH gateway. `hutch ssh SANDBOX [COMMAND…]` (also `hutch sandbox shell`, `hutch sb ssh`): a terminal in
a sandbox, as ``ssh`` gives one: the local terminal in raw mode, window size changes passed on
(SIGWINCH), the remote command's exit code as ours. ``--show`` prints the ``ssh`` command line
that reaches the same sandbox through the server's SSH gateway (``hutch serve --ssh-port``).

As OpenSSH decides: a terminal is asked for only when stdin is one (``-t`` forces it, ``-T``
refuses it). Scripts, CI jobs and agents call ``hutch ssh SBX 'cmd' < file`` (or with stdin a
pipe, /dev/null, or closed): that runs as a plain command with stdout and stderr apart, stdin
passed through once (no terminal echoing it back), and the command's exit code as ours.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shlex
import signal
import sys
import termios
import tty
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from hutch._stdin import piped_stdin
from hutch.cli import _render as render
from hutch.cli._common import (
    UsageError,
    _call,
    _exit_code,
    _json_flag,
    _note,
    _out,
    _Parser,
    _status_note,
    _stderr_sink,
    _stdout_sink,
    _with_client,
)
from hutch.cli._tenancy import _show as _print_record
from hutch.client import SandboxClient
from hutch.models import to_wire
from hutch.terminal import Terminal

_EOT = b"\x04"  # Ctrl-D: what a terminal makes of the end of piped input


def add_parsers(top: Any, sb: Any) -> None:
    keys = top.add_parser("ssh-key", help="public keys that open the SSH gateway to this organization's sandboxes")
    k = keys.add_subparsers(dest="ssh_key_action", metavar="ACTION", parser_class=_Parser)
    k.required = True
    p = k.add_parser("add", help="ssh-key add [FILE] [--name NAME]: FILE is a .pub file (default ~/.ssh/id_ed25519.pub; - reads stdin)")
    p.add_argument("file", nargs="?", metavar="FILE")
    p.add_argument("--name", help="a label (default: the key's comment)")
    _json_flag(p)
    p.set_defaults(handler=cmd_key_add)
    p = k.add_parser("list", aliases=["ls"], help="the organization's SSH keys")
    _json_flag(p)
    p.set_defaults(handler=cmd_key_list)
    p = k.add_parser("remove", aliases=["rm", "delete"], help="ssh-key remove ID")
    p.add_argument("ssh_key_id", metavar="ID")
    _json_flag(p)
    p.set_defaults(handler=cmd_key_remove)

    for parent, name, aliases in ((top, "ssh", []), (sb, "shell", ["ssh"])):
        p = parent.add_parser(name, aliases=aliases, help="an interactive shell (or COMMAND) on a terminal in a sandbox")
        p.add_argument("sandbox_id", metavar="SANDBOX")
        p.add_argument("command", nargs=argparse.REMAINDER, metavar="COMMAND",
                       help="run this (through the shell, as ssh does) instead of a login shell")
        p.add_argument("--show", action="store_true", help="print the equivalent ssh command line and exit")
        p.add_argument("--cwd", help="start in this directory (relative to the workspace)")
        tty_flags = p.add_mutually_exclusive_group()
        tty_flags.add_argument("-t", dest="tty", action="store_const", const=True,
                               help="a terminal even when stdin is not one (as ssh -t)")
        tty_flags.add_argument("-T", dest="tty", action="store_const", const=False,
                               help="no terminal even when stdin is one (as ssh -T)")
        p.set_defaults(handler=cmd_ssh, accepts_command=True, tty=None)


def cmd_key_add(args: argparse.Namespace) -> int:
    if args.file == "-":
        line = sys.stdin.read()
    else:
        path = Path(args.file) if args.file else Path.home() / ".ssh" / "id_ed25519.pub"
        try:
            line = path.read_text()
        except OSError as err:
            raise UsageError(f"cannot read the public key {path}: {err.strerror}") from None
    key = _call(args, lambda c: c.tenancy.add_ssh_key(line, name=args.name))
    return _print_record(key, f"{key.id}  {key.fingerprint}  {render.shown(key.name)}", args)


def cmd_key_list(args: argparse.Namespace) -> int:
    found = _call(args, lambda c: c.tenancy.list_ssh_keys())
    if args.json:
        render.dump_json([to_wire(k) for k in found], _out())
        return 0
    for k in found:
        _out().write(f"{k.id}  {k.fingerprint}  {render.shown(k.name)}  {k.created_at}\n")
    return 0


def cmd_key_remove(args: argparse.Namespace) -> int:
    key = _call(args, lambda c: c.tenancy.remove_ssh_key(args.ssh_key_id))
    return _print_record(key, f"removed {key.id}", args)


def cmd_ssh(args: argparse.Namespace) -> int:
    if args.command and args.command[-1] == "--show":  # the seeds' order: ssh SANDBOX 'cmd' --show
        args.command, args.show = args.command[:-1], True
    if args.show:
        return asyncio.run(_with_client(args, lambda client: _show(client, args)))
    # As ssh: a remote command is one string for the sandbox user's shell.
    argv = ["/bin/sh", "-c", " ".join(args.command)] if args.command else None
    if not (args.tty if args.tty is not None else _stdin_is_terminal()):
        script = " ".join(args.command) if args.command else "exec /bin/sh"
        if args.cwd:  # relative to the workspace, as the terminal's cwd
            script = f"cd {shlex.quote(args.cwd)} && {script}"
        return _plain(args, ["/bin/sh", "-c", script])
    return asyncio.run(_with_client(args, lambda client: _session(client, args.sandbox_id, argv, args.cwd)))


def _stdin_is_terminal() -> bool:
    try:
        return os.isatty(0)
    except OSError:  # closed
        return False


def _plain(args: argparse.Namespace, argv: list[str]) -> int:
    """A command without a terminal: what ``ssh host cmd`` does when stdin is not one."""

    async def work(client: SandboxClient) -> Any:
        sandbox = await client.connect(args.sandbox_id)
        return await sandbox.execute(argv, stdout=_stdout_sink(), stderr=_stderr_sink(), capture=False,
                                     stdin=piped_stdin())

    execution = asyncio.run(_with_client(args, work))
    _status_note(execution.status, execution.output_truncated, execution.error)
    return _exit_code(execution.exit_code)


async def _show(client: SandboxClient, args: argparse.Namespace) -> int:
    info = await client.server_info()
    port = (info.get("ssh") or {}).get("port")
    if not port:
        _note("this server runs no SSH gateway: start it with `hutch serve --ssh-port PORT`")
        return 2
    host = urlsplit(client.url).hostname or "127.0.0.1"
    line = ["ssh", "-p", str(port), f"{args.sandbox_id}@{host}"]
    if args.command:
        line.append(" ".join(args.command))
    print(shlex.join(line))
    return 0


async def _session(client: SandboxClient, sandbox_id: str, argv: list[str] | None, cwd: str | None) -> int:
    interactive = os.isatty(0)
    rows, cols = _size()
    term = await client.terminal(sandbox_id, argv, rows=rows, cols=cols, cwd=cwd,
                                 term=os.environ.get("TERM") or "xterm-256color")
    loop = asyncio.get_running_loop()
    pending: set[asyncio.Task[None]] = set()

    def send(data: bytes) -> None:
        task = asyncio.ensure_future(term.write(data))
        pending.add(task)
        task.add_done_callback(pending.discard)

    def typed() -> None:
        try:
            data = os.read(0, 65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:  # piped input ended: as a terminal would, an end of file
            loop.remove_reader(0)
            send(_EOT)
            return
        send(data)

    async def read_in_thread() -> None:  # stdin epoll refuses: a regular file, /dev/null
        while data := await asyncio.to_thread(_read_or_end):
            send(data)
        send(_EOT)

    reader: asyncio.Task[None] | None = None
    try:
        with _raw(interactive):
            try:
                os.set_blocking(0, False)
                loop.add_reader(0, typed)
            except (PermissionError, ValueError, OSError):
                with contextlib.suppress(OSError):
                    os.set_blocking(0, True)
                reader = asyncio.create_task(read_in_thread())
            if interactive:
                loop.add_signal_handler(signal.SIGWINCH, lambda: send_resize(term, pending))
            out = sys.stdout.buffer
            async for data in term:
                out.write(data)
                out.flush()
    finally:
        if reader is not None:
            reader.cancel()
        with contextlib.suppress(Exception):
            loop.remove_reader(0)
            loop.remove_signal_handler(signal.SIGWINCH)
        with contextlib.suppress(OSError):
            os.set_blocking(0, True)
        await term.close()
    if term.exit_code is None:
        _note("the connection to the terminal was lost")
        return 255  # what ssh answers when the connection drops
    return term.exit_code


def _read_or_end() -> bytes:
    try:
        return os.read(0, 65536)
    except OSError:  # closed
        return b""


def send_resize(term: Terminal, pending: set[asyncio.Task[None]]) -> None:
    rows, cols = _size()
    task = asyncio.ensure_future(term.resize(rows, cols))
    pending.add(task)
    task.add_done_callback(pending.discard)


def _size() -> tuple[int, int]:
    """The local window's size; 24x80 when no terminal knows it (``script`` without a window
    size reports 0x0)."""
    for fd in (1, 0, 2):
        with contextlib.suppress(OSError):
            size = os.get_terminal_size(fd)
            if size.lines > 0 and size.columns > 0:
                return size.lines, size.columns
    return 24, 80


@contextlib.contextmanager
def _raw(interactive: bool) -> Iterator[None]:
    """The local terminal in raw mode (keys go to the sandbox as typed, Ctrl-C included),
    restored however the session ends."""
    if not interactive:
        yield
        return
    saved = termios.tcgetattr(0)
    try:
        tty.setraw(0)
        yield
    finally:
        termios.tcsetattr(0, termios.TCSADRAIN, saved)
