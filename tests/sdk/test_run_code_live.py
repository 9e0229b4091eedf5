"""``sandbox.run_code`` and ``Workspace.run_code`` in the code-interpreter runtime, against a real
``hutch serve`` (local driver) and one sandbox shared by the module: a kernel that keeps its
state, a matplotlib chart as PNG, a DataFrame as an HTML table, an exception as a structured
error, all through hutch's proxy to port 49999 of a sandbox without network."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from hutch.client import SandboxClient
from hutch.errors import InvalidInput, SandboxError
from hutch.workspace import Workspace

ROOT = Path(__file__).resolve().parents[2]
KEY = "interp-test-key"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# The first use of the runtime may build it (about 2 minutes here, see docs/runtimes.md).
pytestmark = pytest.mark.timeout(600)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HUTCH_LOG_LEVEL": "WARNING", "HUTCH_DRIVER": "local",
           "HUTCH_DATA_DIR": str(tmp_path_factory.mktemp("served")), "HUTCH_API_KEY": KEY}
    for var in ("HUTCH_EVENT_LOG", "HUTCH_STORE", "HUTCH_URL"):
        env.pop(var, None)
    proc = subprocess.Popen([sys.executable, "-m", "hutch.cli", "serve", "--port", str(port)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                urllib.request.urlopen(url + "/healthz", timeout=1).close()
                break
            except OSError:
                assert proc.poll() is None, f"hutch serve exited with {proc.returncode}"
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(30)


@pytest.fixture(scope="module")
def sandbox_id(served: str) -> Iterator[str]:
    """One interpreter sandbox for the module; each test connects to it, as another process would."""

    async def create() -> str:
        async with SandboxClient(served, KEY) as client:
            sandbox = await client.create(runtime="code-interpreter", network={"port": 49999})
            # Ready before the tests' calls (each bounded by the client's request timeout).
            info = await client.get(sandbox.id, wait_for_status=["idle", "running"], wait_ms=300_000)
            assert info.status in ("idle", "running"), info.status
            return sandbox.id

    sid = asyncio.run(create())
    yield sid

    async def destroy() -> None:
        async with SandboxClient(served, KEY) as client:
            await client.destroy(sid)

    asyncio.run(destroy())


async def test_state_streams_and_a_network_off_sandbox(served: str, sandbox_id: str) -> None:
    async with SandboxClient(served, KEY) as client:
        sandbox = await client.connect(sandbox_id)
        info = await sandbox.get()
        assert info.network_enabled is False  # the kernel is local: no network needed
        seen: list[str] = []
        first = await sandbox.run_code("import sys\nx = 41\nprint('out'); print('err', file=sys.stderr)",
                                       on_stdout=seen.append)
        assert first.error is None and first.stdout == ("out\n",) and first.stderr == ("err\n",)
        assert seen == ["out\n"]
        second = await sandbox.run_code("x + 1")
        assert second.text == "42" and second.error is None
        assert second.results[0].is_main_result
        # env is the call's own: set for it, gone after it.
        probe = "import os\nos.environ.get('GREETING', 'unset')"
        assert (await sandbox.run_code(probe, env={"GREETING": "hi"})).text == "hi"
        assert (await sandbox.run_code(probe)).text == "unset"


async def test_a_line_of_output_longer_than_aiohttps_limit_arrives(served: str, sandbox_id: str) -> None:
    """aiohttp reads lines of at most 512 KiB; one stdout message (or a big chart's PNG) is longer."""
    async with SandboxClient(served, KEY) as client:
        sandbox = await client.connect(sandbox_id)
        big = await sandbox.run_code("print('x' * 3_000_000)")
        assert big.error is None and "".join(big.stdout) == "x" * 3_000_000 + "\n"


async def test_a_chart_is_png_and_a_dataframe_html(served: str, sandbox_id: str) -> None:
    async with SandboxClient(served, KEY) as client:
        sandbox = await client.connect(sandbox_id)
        chart = await sandbox.run_code("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [3, 1, 2])\nplt.show()")
        assert chart.error is None
        pngs = [r.png for r in chart.results if r.png]
        assert len(pngs) == 1 and pngs[0].startswith(PNG_MAGIC)
        table = await sandbox.run_code("import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': ['x', 'y']})")
        assert table.error is None and table.results[0].html is not None
        assert "<table" in table.results[0].html and "<td>x</td>" in table.results[0].html


async def test_an_exception_is_a_structured_error(served: str, sandbox_id: str) -> None:
    async with SandboxClient(served, KEY) as client:
        sandbox = await client.connect(sandbox_id)
        ran = await sandbox.run_code("def boom():\n    raise ValueError('no good')\nboom()")
        assert ran.error is not None
        assert (ran.error.name, ran.error.value) == ("ValueError", "no good")
        assert "boom()" in ran.error.traceback and "ValueError" in ran.error.traceback
        after = await sandbox.run_code("1 + 1")  # the kernel lives on
        assert after.text == "2"
        died = await sandbox.run_code("import os\nos._exit(3)")  # no idle ever comes from a dead kernel
        assert died.error is not None and died.error.name == "KernelDied" and "restarted" in died.error.value
        assert (await sandbox.run_code("1 + 2")).text == "3"


async def test_contexts_keep_state_apart(served: str, sandbox_id: str) -> None:
    async with SandboxClient(served, KEY) as client:
        sandbox = await client.connect(sandbox_id)
        await sandbox.run_code("mine = 'default'")
        other = await sandbox.create_code_context(cwd="/tmp")
        assert other.language == "python" and other.cwd == "/tmp"
        inside = await sandbox.run_code("import os\nprint(os.getcwd()); mine", context=other)
        assert inside.stdout == ("/tmp\n",)
        assert inside.error is not None and inside.error.name == "NameError"
        with pytest.raises(InvalidInput, match="'cobol' is not served here"):
            await sandbox.create_code_context(language="cobol")


async def test_javascript_through_hutchs_sdk(served: str, sandbox_id: str) -> None:
    async with SandboxClient(served, KEY) as client:
        sandbox = await client.connect(sandbox_id)
        js = await sandbox.create_code_context(language="javascript")
        assert js.language == "javascript" and js.cwd == "/home/agentuity"
        seen: list[str] = []
        await sandbox.run_code("let total = 40", context=js)
        ran = await sandbox.run_code("console.log('adding'); total + 2", context=js, on_stdout=seen.append)
        assert ran.text == "42" and ran.stdout == ("adding\n",) and seen == ["adding\n"] and ran.error is None
        # env is the call's own, as in Python.
        probe = "process.env.GREETING ?? 'unset'"
        assert (await sandbox.run_code(probe, context=js, env={"GREETING": "hi"})).text == "hi"
        assert (await sandbox.run_code(probe, context=js)).text == "unset"
        failed = await sandbox.run_code("null.x", context=js)
        assert failed.error is not None and failed.error.name == "TypeError"
        died = await sandbox.run_code("process.exit(3)", context=js)
        assert died.error is not None and died.error.name == "KernelDied" and "restarted" in died.error.value
        assert (await sandbox.run_code("typeof total", context=js)).text == "undefined"  # a fresh kernel
        # A loop after an await is past SIGINT's reach: the kernel is restarted, and the next cell says so.
        await sandbox.run_code("let lost = 1", context=js)
        with pytest.raises(SandboxError, match="did not finish within 2s"):
            await sandbox.run_code("await null; while (true) {}", context=js, timeout=2)
        after = await sandbox.run_code("typeof lost", context=js)
        assert after.text == "undefined" and "restarted" in "".join(after.stderr)


async def test_javascript_output_at_volume(served: str, sandbox_id: str) -> None:
    """A line longer than a pipe's read and a loop that prints without end: the first arrives
    whole, the second is stopped at the caller's timeout and the context is kept."""
    async with SandboxClient(served, KEY) as client:
        sandbox = await client.connect(sandbox_id)
        js = await sandbox.create_code_context(language="javascript")
        big = await sandbox.run_code("let kept = 'here'; console.log('x'.repeat(3_000_000))", context=js)
        assert big.error is None and "".join(big.stdout) == "x" * 3_000_000 + "\n"
        with pytest.raises(SandboxError, match="did not finish within 2s"):
            await sandbox.run_code("while (true) console.log('spam')", context=js, timeout=2)
        started = time.monotonic()
        after = await sandbox.run_code("kept", context=js)
        assert after.text == "here" and after.stdout == () and time.monotonic() - started < 10
        # A child process's output reaches the kernel's real stdout, not its message pipe: all of
        # it is the cell's, in one piece however the pipe's reads cut its characters.
        child = ("require('child_process').execSync(`python3 -c \"import sys; sys.stdout.write('a' + chr(233) * "
                 "70000)\"`, { stdio: 'inherit' }); 'ok'")
        for _ in range(3):
            ran = await sandbox.run_code(child, context=js)
            assert ran.error is None and ran.text == "ok" and "".join(ran.stdout) == "a" + "\u00e9" * 70000


async def test_the_port_refuses_a_caller_without_the_token(served: str, sandbox_id: str) -> None:
    """The proxy URL is public: without the sandbox's interpreter token nothing runs."""
    async with SandboxClient(served, KEY) as client:
        sandbox = await client.connect(sandbox_id)
        await sandbox.run_code("0")  # started
        assert sandbox.url
        async with aiohttp.ClientSession() as http:
            async with http.post(sandbox.url + "execute", json={"code": "print(1)"}) as resp:
                assert resp.status == 401 and "X-Access-Token" in await resp.text()
            async with http.post(sandbox.url + "execute", json={"code": "print(1)"},
                                 headers={"X-Access-Token": "guess"}) as resp:
                assert resp.status == 401


async def test_a_sandbox_without_the_port_is_told_what_to_do(served: str) -> None:
    async with SandboxClient(served, KEY) as client, await client.create(runtime="base:latest") as sandbox:
        with pytest.raises(InvalidInput, match="network=\\{'port': 49999\\}"):
            await sandbox.run_code("1")


async def test_workspace_run_code_gives_rich_results_without_a_server(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The Workspace's default backend with no server: the engine in this process serves its
    proxy only on its private socket, and run_code reaches the port through it."""
    monkeypatch.delenv("HUTCH_URL", raising=False)
    async with Workspace(runtime="code-interpreter", data_dir=tmp_path) as ws:
        await ws.run_code("import pandas as pd\ndf = pd.DataFrame({'n': [1, 2, 3]})")
        ran = await ws.run_code("print(df.n.sum()); df")
        assert ran.exit_code == 0 and ran.stdout == "6\n" and ran.exception is None
        assert ran.results and "<table" in (ran.results[0].html or "")
        failed = await ws.run_code("1/0")
        assert failed.exit_code == 1 and failed.exception is not None
        assert failed.exception.name == "ZeroDivisionError"
        # language="node" (the Workspace's name for JavaScript) is the JavaScript kernel here.
        await ws.run_code("let n = 2", language="node")
        js = await ws.run_code("console.log('js'); n * 21", language="node")
        assert js.exit_code == 0 and js.stdout == "js\n" and js.results[0].text == "42"
        thrown = await ws.run_code("throw new RangeError('far')", language="node")
        assert thrown.exit_code == 1 and thrown.exception is not None and thrown.exception.name == "RangeError"


async def test_a_cell_past_its_timeout_is_interrupted_and_the_context_lives_on(served: str, sandbox_id: str) -> None:
    async with SandboxClient(served, KEY) as client:
        sandbox = await client.connect(sandbox_id)
        await sandbox.run_code("kept = 'still here'")
        with pytest.raises(SandboxError, match="did not finish within 2s") as caught:
            await sandbox.run_code("import time\nfor _ in range(60):\n    time.sleep(0.5)", timeout=2)
        assert caught.value.code == "EXECUTION_TIMEOUT"
        started = time.monotonic()
        after = await sandbox.run_code("kept")  # not queued behind the 30 s cell: it was interrupted
        assert after.text == "still here" and time.monotonic() - started < 10
