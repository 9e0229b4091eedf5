"""The Workspace's ``e2b`` backend (seed 004's ``remote`` delegating to a cloud sandbox): any
E2B-compatible server, hutch's own E2B wire included, driven through E2B's own SDK (``e2b``).

The SDK finds its server as E2B's users expect (``E2B_API_KEY``, ``E2B_API_URL``,
``E2B_SANDBOX_URL``, ``E2B_DOMAIN``) unless the Workspace names them. The workspace root is
the sandbox user's home as the server reports it (/home/user, E2B's, on hutch's E2B wire too
where its driver can name the account), so paths are confined to whatever home that server
gives. The Workspace's fork and server-side snapshot are not offered on this backend yet (it
says so): E2B's SDK has snapshots and fork, and hutch's E2B wire serves them, but this backend
does not drive them. Its JSON snapshot (files and env) works as everywhere.

Needs ``pip install 'hutch[e2b]'``: imported only when the backend is used, so the light SDK
loads no more than before.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import io
import shlex
import tarfile
from collections.abc import Mapping
from typing import Any

INSTALL = "pip install 'hutch[e2b]'  (or: pip install e2b)"
TIMED_OUT = 124


class E2bUnavailable(RuntimeError):
    """The e2b backend cannot run here: the SDK is not installed or no key names the caller."""


def require_sdk() -> None:
    """Raise E2bUnavailable, with the command that installs it, when the SDK is missing."""
    try:
        found = importlib.util.find_spec("e2b") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise E2bUnavailable(f"backend 'e2b' needs E2B's SDK (the `e2b` package), which is not installed: {INSTALL}")


class E2bBox:
    """One workspace's E2B sandbox, through the SDK's AsyncSandbox."""

    def __init__(self, sandbox: Any, home: str) -> None:
        self.sandbox, self.home = sandbox, home
        self.id: str = sandbox.sandbox_id

    @classmethod
    async def create(cls, template: str, env: Mapping[str, str], network: bool, opts: Mapping[str, Any]) -> E2bBox:
        from e2b import AsyncSandbox

        sandbox = await AsyncSandbox.create(template=template, envs=dict(env) or None,
                                            allow_internet_access=network or None, **_given(opts))
        try:
            return cls(sandbox, await _home(sandbox))
        except BaseException:
            await sandbox.kill()
            raise

    @classmethod
    async def attach(cls, sandbox_id: str, opts: Mapping[str, Any]) -> E2bBox:
        from e2b import AsyncSandbox

        sandbox = await AsyncSandbox.connect(sandbox_id, **_given(opts))
        return cls(sandbox, await _home(sandbox))

    async def kill(self) -> None:
        await self.sandbox.kill()

    async def exec(self, argv: list[str], timeout: float) -> tuple[str, str, int, bool]:
        """Started in the background and killed by its pid at the limit: the SDK's own timeout
        only ends the stream, and an E2B server may leave the command running behind it."""
        from e2b import CommandExitException

        out: list[str] = []
        err_out: list[str] = []  # what came before a timeout: the handle's result never comes
        handle = await self.sandbox.commands.run(shlex.join(argv), background=True, cwd=self.home, timeout=0,
                                                 on_stdout=out.append, on_stderr=err_out.append)
        try:
            done = await asyncio.wait_for(handle.wait(), timeout)
        except CommandExitException as err:
            return err.stdout, err.stderr, err.exit_code, False
        except TimeoutError:
            await handle.kill()  # the whole tree on hutch's wire (commands.kill)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(handle.disconnect(), 5)
            return "".join(out), "".join(err_out), TIMED_OUT, True
        return done.stdout, done.stderr, done.exit_code, False

    async def write(self, full: str, data: bytes) -> None:
        await self.sandbox.files.write(full, data)  # parents made

    async def read(self, full: str) -> bytes | None:
        from e2b import FileNotFoundException

        try:
            return bytes(await self.sandbox.files.read(full, format="bytes"))
        except FileNotFoundException:
            return None

    async def listing(self, full: str) -> list[tuple[str, bool, int]] | None:
        from e2b import FileNotFoundException, FileType

        try:
            entries = await self.sandbox.files.list(full, depth=1)
        except FileNotFoundException:
            return None
        return [(e.name, e.type == FileType.DIR, e.size or 0) for e in entries]

    async def files(self) -> list[tuple[str, bytes]]:
        """Every regular file below the home, by a tar the sandbox makes outside it (commands
        carry text, so the archive comes back through the file API, as bytes)."""
        made = await self.exec(["sh", "-c", 'f=$(mktemp) && tar -cf "$f" -C "$1" . && echo "$f"', "sh", self.home],
                               300)
        if made[2] != 0:
            raise RuntimeError(f"backend 'e2b': archiving the workspace failed (exit {made[2]}): {made[1].strip()[-500:]}")
        archive = made[0].strip()
        try:
            raw = await self.read(archive)
        finally:
            await self.exec(["rm", "-f", archive], 60)
        out = []
        with tarfile.open(fileobj=io.BytesIO(raw or b""), mode="r:") as tar:
            for member in tar.getmembers():
                handle = tar.extractfile(member) if member.isfile() else None
                if handle is not None:
                    out.append((member.name.removeprefix("./"), handle.read()))
        return out


def _given(opts: Mapping[str, Any]) -> dict[str, Any]:
    return {name: value for name, value in opts.items() if value is not None}  # the rest: the SDK's env vars


async def _home(sandbox: Any) -> str:
    done = await sandbox.commands.run("pwd", timeout=60)  # a command's cwd is the user's home
    home = str(done.stdout).strip()
    if not home.startswith("/"):
        raise RuntimeError(f"backend 'e2b': the sandbox did not say where its home is (pwd gave {home!r})")
    return home
