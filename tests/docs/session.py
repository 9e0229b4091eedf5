"""One page's run: a fresh HOME and work directory, one `hutch serve`, its blocks in order.

What a block may rely on is the convention in ``test_code_blocks.py``; this module makes it so.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.docs.blocks import Block, Page, shell_script
from tests.leftovers import destroy_every_sandbox

REPO = Path(__file__).resolve().parents[2]
BLOCK_TIMEOUT = 240  # seconds; a first use may build a runtime (workspace:latest: about a minute)
# Inherited settings a page must not see: the page's own server and HOME decide them.
_KEEP_HUTCH = ("HUTCH_TEST_", "HUTCH_NOMAD_")
# Lines bash puts in `export -p` that must not travel from one block to the next.
_SHELL_OWN = {"PWD", "OLDPWD", "SHLVL", "_", "__doc_rc", "BASHOPTS", "SHELLOPTS"}
_FAILED_AT = re.compile(r"^doc-test-failed-at (\d+) \(exit (\d+)\): (.*)$", re.M)
_PRELUDE = """set -a
[ -f "$DOC_STATE" ] && . "$DOC_STATE"
set -eE -o pipefail
trap 'echo "doc-test-failed-at $((LINENO - 4)) (exit $?): $BASH_COMMAND" >&2' ERR
"""  # 4 lines: block line n is script line n + 4
_EPILOGUE = """
trap - ERR
export -p > "$DOC_STATE.new"
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PageSession:
    """Runs a page's blocks; ``failures`` collects what failed, with where and the output."""

    def __init__(self, page: Page, tmp: Path) -> None:
        self.page = page
        self.home = tmp / "home"
        self.work = tmp / "work"
        self.state = tmp / "shell-state"
        self.failures: list[str] = []
        self.cleanup_errors: list[str] = []
        self.timings: list[tuple[str, float]] = []
        self.server: subprocess.Popen[bytes] | None = None
        self.server_log = tmp / "serve.log"
        self.embedded_data = tmp / "embedded-data"  # blocks marked `without a server`
        self.url = ""
        self.key = ""
        self.env = self._base_env()
        self._cleanups: list[tuple[str, str]] = []  # (kind, name): topics and databases made for it

    def _base_env(self) -> dict[str, str]:
        self.home.mkdir()
        self.work.mkdir()
        # The work directory looks like a checkout (./scripts/…, examples/…) without writing into it.
        for entry in REPO.iterdir():
            if not entry.name.startswith(".") and entry.name not in ("site", "node_modules"):
                (self.work / entry.name).symlink_to(entry)
        compat_modules = REPO / "tests" / "compat" / "node_modules"
        (self.work / "node_modules").symlink_to(compat_modules)
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("HUTCH_") or k.startswith(_KEEP_HUTCH)}
        # hutch and python3 of the interpreter running the tests, whatever a fresh HOME does to
        # shims (pyenv's need theirs).
        env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '/usr/bin:/bin')}"
        env["HOME"] = str(self.home)
        env["DOC_STATE"] = str(self.state)
        env.pop("PYTHONSTARTUP", None)
        self._ssh_reads_home(env)
        return env

    def _ssh_reads_home(self, env: dict[str, str]) -> None:
        """OpenSSH takes ~/.ssh from the passwd entry, not $HOME: ssh and scp are wrapped to read
        the page's HOME, where a user would answer "yes" to the gateway's new host key."""
        ssh_dir = self.home / ".ssh"
        ssh_dir.mkdir(mode=0o700)
        (ssh_dir / "config").write_text(
            f"Host 127.0.0.1\n  StrictHostKeyChecking accept-new\n"
            f"  UserKnownHostsFile {ssh_dir}/known_hosts\n  IdentityFile {ssh_dir}/id_ed25519\n"
        )
        bin_dir = self.work.parent / "bin"
        bin_dir.mkdir()
        for tool in ("ssh", "scp", "sftp"):
            real = shutil.which(tool, path=env["PATH"])
            if real:
                wrapper = bin_dir / tool
                wrapper.write_text(f'#!/bin/sh\nexec {real} -F "$HOME/.ssh/config" "$@"\n')
                wrapper.chmod(0o755)
        env["PATH"] = f"{bin_dir}:{env['PATH']}"

    # -- services -------------------------------------------------------------------------------

    def service_env(self, needs: set[str], *, fresh: bool) -> dict[str, str]:
        """The settings of the services named, as scripts/test exports them; missing ones fail."""
        from tests import services

        out: dict[str, str] = {}
        if {"kafka", "postgres"} & needs:
            if fresh:
                log = services.kafka_url("docs")
                store, name = asyncio.run(services.fresh_database("docs"))
                self._cleanups += [("topic", log), ("database", name)]
                out |= {"HUTCH_EVENT_LOG": log, "HUTCH_STORE": store}
            else:
                out |= {"HUTCH_EVENT_LOG": services._setting("HUTCH_TEST_EVENT_LOG", "HUTCH_EVENT_LOG"),
                        "HUTCH_STORE": services.postgres_admin_url()}
            for url in (out["HUTCH_EVENT_LOG"].replace("kafka://", "tcp://"), out["HUTCH_STORE"]):
                _reachable(url)
        if "nomad" in needs:
            addr = os.environ.get("HUTCH_NOMAD_ADDR")
            if not addr:
                pytest.fail("HUTCH_NOMAD_ADDR is not set: the page needs Nomad; scripts/test starts it "
                            "(./scripts/services start nomad)", pytrace=False)
            _reachable(addr)
            out |= {k: v for k, v in os.environ.items() if k.startswith("HUTCH_NOMAD_")}
            out["HUTCH_NOMAD_POOL"] = "off"  # the machine's one dev agent is shared: no idle allocations
        if "cluster" in needs:
            addr = os.environ.get("HUTCH_TEST_CLUSTER_ADDR")
            if not addr:
                pytest.fail("HUTCH_TEST_CLUSTER_ADDR is not set: the block needs the cluster; scripts/test "
                            "starts it (./scripts/services start cluster)", pytrace=False)
            _reachable(addr)
        return out

    # -- the page's server ------------------------------------------------------------------------

    def start_server(self) -> None:
        port = _free_port()
        env = self.env | self.service_env(self.page.needs, fresh=True) | {"HUTCH_LOG_LEVEL": "WARNING"}
        cmd = [sys.executable, "-m", "hutch.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
               *self.page.serve_args]
        with self.server_log.open("wb") as log:
            self.server = subprocess.Popen(cmd, env=env, cwd=self.work, stdout=log, stderr=subprocess.STDOUT,
                                           stdin=subprocess.DEVNULL, start_new_session=True)
        self.url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.server.poll() is not None:
                pytest.fail(f"{self.page.path.name}: `hutch serve {' '.join(self.page.serve_args)}` exited "
                            f"{self.server.returncode}:\n{self.server_log.read_text()}", pytrace=False)
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            time.sleep(0.1)
        else:
            pytest.fail(f"{self.page.path.name}: hutch serve did not answer in 60 s:\n{self.server_log.read_text()}")
        self.key = (self.home / ".local" / "share" / "hutch" / "api-key").read_text().strip()
        self.env |= {"HUTCH_URL": self.url, "HUTCH_API_KEY": self.key}
        self.env |= {k: v for k, v in env.items() if k in ("HUTCH_EVENT_LOG", "HUTCH_STORE")}

    def close(self) -> None:
        if self.server is not None and self.server.poll() is None:
            try:
                destroy_every_sandbox(self.url, self.key)
            except Exception as err:  # reported by the test once the server is down
                self.cleanup_errors.append(f"{self.page.path.name}: destroying the page's sandboxes: {err!r}")
            self.server.send_signal(signal.SIGTERM)
            try:
                self.server.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.server.pid, signal.SIGKILL)
                self.server.wait(5)
        if self.embedded_data.exists():
            self._destroy_embedded_sandboxes()
        from tests import services

        for kind, name in self._cleanups:
            with contextlib.suppress(Exception):  # best effort: a leftover only costs disk
                asyncio.run(services.drop_topics(name) if kind == "topic" else services.drop_database(name))

    def _destroy_embedded_sandboxes(self) -> None:
        """Sandboxes outlive the process that made them: what blocks without a server left."""
        env = {k: v for k, v in self.env.items() if k not in ("HUTCH_URL", "HUTCH_API_KEY")}
        env["HUTCH_DATA_DIR"] = str(self.embedded_data)
        script = (
            "import asyncio\n"
            "from hutch import SandboxClient\n"
            "async def main():\n"
            "    async with SandboxClient() as client:\n"
            "        async for info in client.iter_sandboxes():\n"
            "            if info.status not in ('deleted', 'terminated', 'failed'):\n"
            "                await client.destroy(info.id)\n"
            "asyncio.run(main())\n"
        )
        code, out = _run([sys.executable, "-c", script], env, self.work)
        if code != 0:
            self.cleanup_errors.append(f"{self.page.path.name}: destroying the in-process sandboxes:\n{out}")

    # -- blocks ----------------------------------------------------------------------------------

    def run(self, block: Block) -> None:
        env = self.env | self.service_env(block.needs, fresh=False)
        if block.without_server:
            # No server for this block: the CLI and the SDK run the engine in their own process,
            # on a data dir no `hutch serve` serves.
            env = {k: v for k, v in env.items() if k not in ("HUTCH_URL", "HUTCH_API_KEY")}
            env["HUTCH_DATA_DIR"] = str(self.embedded_data)
        started = time.monotonic()
        if block.kind == "sh":
            ok, output = self._run_shell(block, env)
        elif block.kind == "python":
            ok, output = self._run_file(block, env, ".py", [sys.executable])
        else:
            ok, output = self._run_file(block, env, ".mjs", ["node"])
        self.timings.append((block.where(), time.monotonic() - started))
        if not ok:
            self.failures.append(output)

    def _run_shell(self, block: Block, env: dict[str, str]) -> tuple[bool, str]:
        script = self.work.parent / f"block-{block.line}.sh"
        script.write_text(_PRELUDE + shell_script(block) + _EPILOGUE)
        code, out = _run(["bash", str(script)], env, self.work)
        if code == 0:
            _keep_state(Path(str(self.state) + ".new"), self.state)
            return True, out
        at = _FAILED_AT.findall(out)
        if at:
            n, rc, command = at[-1]
            line = block.line + int(n) - 1
            where = f"{block.path.name}:{line}: `{command}` exited {rc}"
        else:
            where = f"{block.where()}: the block exited {code}"
        return False, f"{where}\n--- output ---\n{out.rstrip()}"

    def _run_file(self, block: Block, env: dict[str, str], suffix: str, argv: list[str]) -> tuple[bool, str]:
        path = self.work / f"block-{block.line}{suffix}"
        path.write_text(block.text)
        code, out = _run([*argv, str(path)], env, self.work)
        if code == 0:
            return True, out
        return False, f"{block.where()}: the ```{block.lang} block exited {code}\n--- output ---\n{out.rstrip()}"


def _run(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[int, str]:
    """Run in a session of its own; whatever it leaves in the background is ended with it."""
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=BLOCK_TIMEOUT)
        code = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        code = -1
        out += f"\n(doc test: killed after {BLOCK_TIMEOUT} s)".encode()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    return code, out.decode(errors="replace")


def _keep_state(new: Path, state: Path) -> None:
    """Variables a block set, for the next block; bash's own and the per-run ones stay behind."""
    keep = []
    for line in new.read_text().splitlines():
        m = re.match(r"declare -x ([A-Za-z_][A-Za-z0-9_]*)", line)
        if m and m[1] not in _SHELL_OWN:
            keep.append(line)
    state.write_text("\n".join(keep) + "\n")
    new.unlink()


def _reachable(url: str) -> None:
    parts = urllib.parse.urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    try:
        socket.create_connection((host, port), timeout=3).close()
    except OSError as err:
        pytest.fail(f"{url}: not reachable ({err}); start the services with scripts/test's commands "
                    "(./scripts/services start …)", pytrace=False)


@contextlib.contextmanager
def page_session(page: Page) -> Iterator[PageSession]:
    tmp = Path(tempfile.mkdtemp(prefix="hutch-docs-"))
    session = PageSession(page, tmp)
    try:
        yield session
    finally:
        session.close()
        shutil.rmtree(tmp, ignore_errors=True)
