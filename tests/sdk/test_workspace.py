"""hutch.Workspace on its five backends: every method, the document's failure-mode table row by
row, snapshots across backends, reattach from another process, and the LLM tools (the docker
backend's own tests: test_workspace_docker.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from hutch.workspace import Workspace, WorkspaceSnapshot

ROOT = Path(__file__).resolve().parents[2]
KEY = "workspace-test-key"


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def serving(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """One hutch server (local driver) for the remote backend and, on its E2B wire, the e2b one:
    (its URL, its E2B wire's URL)."""
    port, e2b_port = _free_port(), _free_port()
    data = tmp_path_factory.mktemp("served")
    env = {**os.environ, "HUTCH_DATA_DIR": str(data), "HUTCH_DRIVER": "local", "HUTCH_API_KEY": KEY,
           "HUTCH_LOG_LEVEL": "WARNING", "PYTHONPATH": str(ROOT)}
    for var in ("HUTCH_URL", "HUTCH_EVENT_LOG", "HUTCH_STORE"):
        env.pop(var, None)
    proc = subprocess.Popen([sys.executable, "-m", "hutch.cli", "serve", "--port", str(port), "--e2b-port",
                             str(e2b_port)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                urllib.request.urlopen(url + "/healthz", timeout=1).close()
                break
            except OSError:
                assert proc.poll() is None
                time.sleep(0.1)
        yield url, f"http://127.0.0.1:{e2b_port}"
    finally:
        proc.terminate()
        proc.wait(30)


@pytest.fixture(scope="module")
def served(serving: tuple[str, str]) -> str:
    return serving[0]


@pytest.fixture
def e2b_env(serving: tuple[str, str], monkeypatch: pytest.MonkeyPatch) -> str:
    """E2B's SDK pointed at the module's server by its own variables, as its users do."""
    for var in ("E2B_API_URL", "E2B_SANDBOX_URL"):
        monkeypatch.setenv(var, serving[1])
    monkeypatch.setenv("E2B_API_KEY", KEY)
    monkeypatch.delenv("E2B_DOMAIN", raising=False)
    monkeypatch.delenv("E2B_DEBUG", raising=False)
    return serving[1]


def built_tree(name: str) -> None:
    """The docker backend imports a runtime's built tree and refuses without one: build it (a
    no-op when cached; the sandbox backend builds on first use by itself)."""
    from hutch.drivers.local import rootfs

    rootfs.build(rootfs.lookup(name), rootfs.default_cache(), log=lambda msg: print(msg, file=sys.stderr))


@pytest.fixture(params=["unix-local", "sandbox", "remote", "docker", "e2b"])
async def workspace(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Workspace]:
    options: dict = {"backend": request.param, "language": "python", "files": {"seed.txt": "seeded\n"},
                     "env": {"STAGE": "one"}, "timeout_seconds": 30}
    if request.param == "docker":
        built_tree("workspace:latest")
    if request.param == "sandbox":
        options["data_dir"] = tmp_path / "engine"
    if request.param == "remote":
        options.update(url=request.getfixturevalue("served"), api_key=KEY)
    if request.param == "e2b":
        request.getfixturevalue("e2b_env")
    ws = Workspace(**options)
    await ws.start()
    try:
        yield ws
    finally:
        await ws.close()


async def test_every_method_and_the_failure_table(workspace: Workspace) -> None:
    ws = workspace
    assert ws.ready
    await ws.start()  # idempotent
    assert await ws.read_file("seed.txt") == "seeded\n"
    r = await ws.run("import os; print(6 * 7); print(os.environ['STAGE'])")
    assert (r.stdout, r.exit_code, r.timed_out) == ("42\none\n", 0, False)
    bad = await ws.run("import sys; sys.stderr.write('oops'); sys.exit(3)")
    assert (bad.exit_code, bad.stderr, bad.output) == (3, "oops", "oops")
    sh = await ws.shell("echo from-shell; ls")
    assert sh.stdout.startswith("from-shell\n") and "seed.txt" in sh.stdout
    await ws.write_file("deep/er/notes.md", "- fix the bug\n")  # parents made
    assert await ws.read_file("deep/er/notes.md") == "- fix the bug\n"
    await ws.write_file("blob.bin", "AAEC/w==", "base64")
    assert await ws.read_file("blob.bin", "base64") == "AAEC/w=="
    top = {e["name"]: e for e in await ws.list_files()}
    assert top["deep"]["is_dir"] and not top["seed.txt"]["is_dir"] and top["seed.txt"]["size"] == 7
    assert [e["name"] for e in await ws.list_files("deep/er")] == ["notes.md"]
    with pytest.raises(ValueError, match="no such directory"):
        await ws.list_files("no/such/dir")
    with pytest.raises(ValueError, match="outside the workspace"):
        await ws.list_files("..")
    # The document's failure modes, row by row.
    slow = await ws.run("import time; time.sleep(30)", timeout_seconds=1)
    assert (slow.timed_out, slow.exit_code) == (True, 124)
    assert await ws.read_file("no/such/file") is None
    for escape in ("../outside.txt", "/etc/passwd", "deep/../../x"):
        with pytest.raises(ValueError, match="outside the workspace"):
            await ws.write_file(escape, "x")
    with pytest.raises(ValueError, match="language"):
        await ws.run("1", language="cobol")
    for bound in (0, 1.5, True):
        with pytest.raises(ValueError, match="max_bytes: expected a number of bytes"):
            Workspace(max_bytes=bound)
    await ws.close()
    await ws.close()  # a no-op the second time
    assert not ws.ready
    with pytest.raises(RuntimeError, match="not started"):
        await ws.run("1")


@pytest.mark.parametrize("backend", ["unix-local", "docker"])
async def test_what_the_code_plants_does_not_carry_this_process_outside(tmp_path: Path, backend: str) -> None:
    """The workspace's code plants a symlink to a directory outside, a symlinked parent and a
    FIFO. A write follows no link (checked after making the parents, `escape/deeper` used to
    appear outside), a read or a snapshot brings no outside file in, and a FIFO does not hang
    the call (it held a worker thread for good). This matters most where this process has more
    rights than the code it runs (docker, as root)."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("host secret")
    if backend == "docker":
        built_tree("workspace:latest")
    async with Workspace(backend=backend, language="shell") as ws:
        await ws.shell(f"ln -s {outside} escape; ln -s {outside}/secret.txt leak.txt; mkdir -p d; mkfifo d/pipe")
        for path in ("escape/owned.txt", "leak.txt", "escape/deeper/owned.txt"):
            with pytest.raises(ValueError, match="outside the workspace"):
                await ws.write_file(path, "x")
        with pytest.raises(ValueError, match="not a regular file"):
            await ws.write_file("d/pipe", "x")
        assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]
        assert (outside / "secret.txt").read_text() == "host secret"
        assert await ws.read_file("escape/secret.txt") is None
        assert await ws.read_file("leak.txt") is None
        assert await ws.read_file("d/pipe") is None
        assert set((await ws.snapshot()).files) == set()


async def test_snapshots_move_between_backends(tmp_path: Path) -> None:
    engine = tmp_path / "engine"
    async with Workspace(backend="unix-local", language="python", files={"a.py": "print('from a')"},
                         env={"K": "v"}) as local:
        saved = (await local.snapshot()).to_dict()
    assert saved["files"] == {"a.py": "cHJpbnQoJ2Zyb20gYScp"} and saved["snapshotId"] is None
    # unix-local -> sandbox: the files are written.
    into = await Workspace.resume(WorkspaceSnapshot.from_dict(json.loads(json.dumps(saved))), backend="sandbox",
                                  language="python", data_dir=engine)
    try:
        assert (await into.run("import os; exec(open('a.py').read()); print(os.environ['K'])")).stdout == "from a\nv\n"
        await into.write_file("b.txt", "made in the sandbox")
        back = await into.snapshot()
        assert back.snapshot_id and set(back.files) >= {"a.py", "b.txt"}
    finally:
        await into.close()
    # sandbox -> sandbox: the native snapshot; sandbox -> unix-local: the files.
    again = await Workspace.resume(back, language="python", data_dir=engine)
    try:
        assert await again.read_file("b.txt") == "made in the sandbox"
        assert again._from_snapshot == back.snapshot_id
    finally:
        await again.close()
    home = await Workspace.resume(back, backend="unix-local")
    try:
        assert await home.read_file("b.txt") == "made in the sandbox"
    finally:
        await home.close()


@pytest.mark.parametrize("backend", ["sandbox", "docker"])
def test_each_turn_a_separate_process(tmp_path: Path, backend: str) -> None:
    """The document's pattern: each user turn is a new process; the workspace lives on."""
    engine = tmp_path / "engine"
    if backend == "docker":
        built_tree("workspace:latest")
    turn = """
import asyncio, sys
from hutch.workspace import Workspace
async def main():
    ws = Workspace(backend=sys.argv[1], language="python", data_dir=sys.argv[2],
                   workspace_id=sys.argv[3] if len(sys.argv) > 3 else None)
    await ws.start()
    n = int(await ws.read_file("turns.txt") or "0") + 1
    await ws.write_file("turns.txt", str(n))
    print(ws.id, n, (await ws.run("print(open('turns.txt').read())")).stdout.strip())
    await (ws.close() if n == 3 else ws.detach())
asyncio.run(main())
"""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    first = subprocess.run([sys.executable, "-c", turn, backend, str(engine)], env=env, capture_output=True, text=True,
                           check=True)
    sid, n, seen = first.stdout.split()
    assert n == seen == "1" and (sid.startswith("sbx_") if backend == "sandbox" else len(sid) == 64)
    for expected in ("2", "3"):
        out = subprocess.run([sys.executable, "-c", turn, backend, str(engine), sid], env=env, capture_output=True,
                             text=True, check=True).stdout.split()
        assert out == [sid, expected, expected]


async def test_tools_for_a_scripted_model(tmp_path: Path) -> None:
    """A fake model's tool calls, OpenAI- and Anthropic-shaped, through the dispatcher."""
    async with Workspace(backend="sandbox", language="python", data_dir=tmp_path / "engine") as ws:
        tools = ws.tools()
        assert {t["function"]["name"] for t in tools.openai()} == {"run_code", "shell", "write_file", "read_file",
                                                                    "list_files", "snapshot"}
        assert all("input_schema" in t for t in tools.anthropic())
        script = [
            {"id": "c1", "function": {"name": "write_file", "arguments": json.dumps({"path": "m.py", "contents": "X = 41\n"})}},
            {"type": "tool_use", "id": "c2", "name": "run_code", "input": {"code": "import m; print(m.X + 1)"}},
            {"id": "c3", "function": {"name": "read_file", "arguments": '{"path": "m.py"}'}},
            {"id": "c4", "function": {"name": "rm_rf", "arguments": "{}"}},
            {"id": "c5", "function": {"name": "shell", "arguments": "not json"}},
            {"type": "tool_use", "id": "c6", "name": "write_file", "input": {"path": "../x", "contents": "no"}},
            {"id": "c7", "function": {"name": "list_files", "arguments": "{}"}},
            {"type": "tool_use", "id": "c8", "name": "snapshot", "input": {}},
        ]
        replies = [await tools.dispatch(call) for call in script]
    assert replies[0] == {"role": "tool", "tool_call_id": "c1", "content": json.dumps({"written": "m.py"})}
    assert replies[1]["type"] == "tool_result" and not replies[1]["is_error"]
    assert json.loads(replies[1]["content"])["stdout"] == "42\n"
    assert json.loads(replies[2]["content"])["contents"] == "X = 41\n"
    assert "unknown tool" in json.loads(replies[3]["content"])["error"]
    assert "error" in json.loads(replies[4]["content"])
    assert replies[5]["is_error"] and "outside the workspace" in replies[5]["content"]
    assert {"name": "m.py", "is_dir": False, "size": 7} in json.loads(replies[6]["content"])["files"]
    snap = json.loads(replies[7]["content"])
    assert snap["snapshot_id"].startswith("snp_") and "m.py" in snap["files"], snap


async def test_tool_arguments_that_miss_their_schema_are_errors_and_run_nothing() -> None:
    """A model's arguments of the wrong type or past their bounds: an error result naming the
    argument, nothing run. ``"timeout_seconds": "5"`` raised TypeError out of ``dispatch``
    after its command had started (and left it running); ``-3`` ended it at once as timed out."""
    async with Workspace(backend="unix-local") as ws:
        tools = ws.tools()
        for name, args, needle in (
            ("shell", {"command": "touch ran", "timeout_seconds": "5"}, "timeout_seconds: expected a number"),
            ("shell", {"command": "touch ran", "timeout_seconds": [1]}, "timeout_seconds: expected a number"),
            ("shell", {"command": "touch ran", "timeout_seconds": -3}, "timeout_seconds: expected a number of at"),
            ("run_code", {"code": "touch ran", "language": "shell", "timeout_seconds": 1e9}, "from 1 to 3600"),
            ("run_code", {"code": "touch ran", "language": "cobol"}, "language: expected one of"),
            ("write_file", {"path": "ran", "contents": None}, "contents: expected a string"),
            ("read_file", {"path": ["ran"]}, "path: expected a string"),
        ):
            for call in ({"id": "c", "function": {"name": name, "arguments": json.dumps(args)}},
                         {"type": "tool_use", "id": "c", "name": name, "input": args}):
                reply = await tools.dispatch(call)
                assert needle in json.loads(reply["content"])["error"], (args, reply)
        assert await ws.read_file("ran") is None
        # null for an optional argument is as absent (OpenAI's strict mode sends every one).
        reply = await tools.dispatch({"type": "tool_use", "id": "c", "name": "shell",
                                      "input": {"command": "echo ok", "timeout_seconds": None}})
        assert not reply["is_error"] and json.loads(reply["content"])["stdout"] == "ok\n"


def test_the_readme_agent_loop(tmp_path: Path) -> None:
    """examples/agent_loop.py: bug, failing tests, fix, passing tests, snapshot; a new process resumes."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HUTCH_DATA_DIR": str(tmp_path / "engine")}
    state = tmp_path / "state.json"
    one = subprocess.run([sys.executable, str(ROOT / "examples" / "agent_loop.py"), "turn1", str(state)], env=env,
                         capture_output=True, text=True, timeout=300)
    assert one.returncode == 0, one.stderr
    lines = one.stdout.splitlines()
    assert lines[1].startswith("run_code -> 1") and "AssertionError" in lines[1]
    assert lines[3].startswith("run_code -> 0")
    two = subprocess.run([sys.executable, str(ROOT / "examples" / "agent_loop.py"), "turn2", str(state)], env=env,
                         capture_output=True, text=True, timeout=300)
    assert two.returncode == 0, two.stderr
    assert "return a + b" in two.stdout and "tests after resume -> 0 tests pass" in two.stdout


def test_the_blocking_twin(tmp_path: Path) -> None:
    from hutch import SyncWorkspace

    with SyncWorkspace(language="python", data_dir=tmp_path / "engine", files={"a.txt": "hi"}) as ws:
        assert ws.ready and ws.id.startswith("sbx_")
        assert ws.run("print(open('a.txt').read())").stdout == "hi\n"
        snap = ws.snapshot()
    back = SyncWorkspace.resume(snap, backend="unix-local")
    try:
        assert back.read_file("a.txt") == "hi"
    finally:
        back.close()


async def test_fork_gives_isolated_copies(tmp_path: Path) -> None:
    async with Workspace(language="python", data_dir=tmp_path / "engine", files={"plan.txt": "A"},
                         env={"STAGE": "one"}) as ws:
        copies = await ws.fork(2)
        try:
            await copies[0].write_file("plan.txt", "B")
            assert await copies[0].read_file("plan.txt") == "B"
            assert await copies[1].read_file("plan.txt") == "A"  # the others and the parent keep theirs
            assert await ws.read_file("plan.txt") == "A"
            assert (await copies[1].run("import os; print(os.environ['STAGE'])")).stdout == "one\n"
        finally:
            for c in copies:
                await c.close()


async def test_git_clones_at_start(tmp_path: Path) -> None:
    """unix-local clones with the host's git (a local repository here: the sandbox backends
    clone inside the sandbox, which then has network, from a host the sandbox can reach)."""
    repo = _git_repo(tmp_path / "repo", {"README.md": "cloned\n"})
    async with Workspace(backend="unix-local", git_clones=[{"url": f"file://{repo}", "dir": "src"}]) as ws:
        assert await ws.read_file("src/README.md") == "cloned\n"
    with pytest.raises(RuntimeError, match="git clone"):
        async with Workspace(backend="unix-local", git_clones=[{"url": f"file://{tmp_path}/nope"}]):
            pass
    # A clone's dir is a workspace path like any other: `../x` would land beside the workspace.
    beside = f"escaped-{os.getpid()}"
    with pytest.raises(ValueError, match="outside the workspace"):
        async with Workspace(backend="unix-local", git_clones=[{"url": f"file://{repo}", "dir": f"../{beside}"}]):
            pass
    assert not (Path(tempfile.gettempdir()) / beside).exists()


def _git_repo(path: Path, files: dict[str, str]) -> Path:
    path.mkdir()
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q", "-b", "main"], cwd=path, check=True)
    for name, text in files.items():
        (path / name).write_text(text)
    subprocess.run([*git, "add", "."], cwd=path, check=True)
    subprocess.run([*git, "commit", "-q", "-m", "files"], cwd=path, check=True)
    return path


@pytest.mark.timeout(600)  # a fresh machine builds workspace:latest (Node.js from npm) first
async def test_a_default_workspace_runs_every_language_it_names(tmp_path: Path) -> None:
    """Seed 004 picks the interpreter per call: node, python and shell all work in a workspace
    made with the defaults (language node), and in one made for python."""
    async with Workspace(data_dir=tmp_path / "engine") as ws:
        assert ws.runtime == "workspace:latest"
        assert (await ws.run("console.log(6*7)")).stdout == "42\n"
        assert (await ws.run("print(6*7)", language="python")).stdout == "42\n"
        assert (await ws.shell("git --version >/dev/null && echo has-git")).stdout == "has-git\n"


@pytest.mark.parametrize("backend", ["sandbox", "unix-local", "docker"])
async def test_a_module_rewritten_within_a_second_runs_as_written(tmp_path: Path, backend: str,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """An agent fixes a module and reruns at once: same size, same mtime second. Python's cached
    bytecode must not win (also with -B, also from a new process)."""
    monkeypatch.delenv("PYTHONDONTWRITEBYTECODE", raising=False)  # unix-local runs the host's python
    options: dict[str, Any] = {"data_dir": tmp_path / "engine"} if backend == "sandbox" else {}
    if backend == "docker":
        built_tree("workspace:latest")
    async with Workspace(backend=backend, language="python", runtime="python:3.13" if backend == "sandbox" else None,
                         **options) as ws:
        for body, expected in (("x * x", "49"), ("x + x", "14"), ("x - x", "0"), ("x * x", "49")):
            await ws.write_file("mod.py", f"def sq(x):\n    return {body}\n")
            assert (await ws.run("from mod import sq; print(sq(7))")).stdout == expected + "\n"
            assert (await ws.shell("python3 -B -c 'from mod import sq; print(sq(7))'")).stdout == expected + "\n"


async def test_the_e2b_backend_by_its_arguments_detached_reattached_and_what_it_cannot(
        serving: tuple[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """No E2B_* variable: the server named by the arguments. A timed-out command is killed and
    keeps what it printed before its limit (the SDK's timeout does neither); the workspace outlives
    a detach and comes back by its id; E2B's API has no fork, and the Workspace says so."""
    for var in ("E2B_API_URL", "E2B_SANDBOX_URL", "E2B_API_KEY", "E2B_DOMAIN"):
        monkeypatch.delenv(var, raising=False)
    named = {"backend": "e2b", "url": serving[1], "sandbox_url": serving[1], "api_key": KEY}
    ws = Workspace(**named, language="shell", env={"STAGE": "two"})
    await ws.start()
    try:
        assert (await ws.shell("pwd; echo $STAGE")).stdout == "/home/user\ntwo\n"  # E2B's home, as E2B's
        slow = await ws.shell("echo before; sleep 30", timeout_seconds=1)
        assert (slow.stdout, slow.timed_out, slow.exit_code) == ("before\n", True, 124)
        assert "sleep 30" not in (await ws.shell("ps -eo args")).stdout  # killed at its limit, not left behind
        await ws.write_file("kept/a.txt", "across turns")
        with pytest.raises(RuntimeError, match="backend 'e2b' cannot fork"):
            await ws.fork(1)
        await ws.detach()
        again = Workspace(**named, workspace_id=ws.id)
        await again.start()
        assert await again.read_file("kept/a.txt") == "across turns"
        saved = await again.snapshot()  # files and env as JSON; no native snapshot on this wire
        assert (saved.backend, saved.snapshot_id, saved.files) == ("e2b", None, {"kept/a.txt": "YWNyb3NzIHR1cm5z"})
        home = await Workspace.resume(saved, backend="unix-local")
        assert await home.read_file("kept/a.txt") == "across turns"
        await home.close()
        await again.close()
        from e2b import NotFoundException

        with pytest.raises(NotFoundException, match="not found"):  # close() ended the sandbox itself
            await Workspace(**named, workspace_id=ws.id).start()
    finally:
        await ws.close()


def test_the_e2b_backend_says_what_it_lacks(monkeypatch: pytest.MonkeyPatch) -> None:
    from hutch._workspace_e2b import E2bUnavailable

    monkeypatch.delenv("E2B_API_KEY", raising=False)
    with pytest.raises(ValueError, match="backend 'e2b' needs api_key= or E2B_API_KEY"):
        Workspace(backend="e2b")
    monkeypatch.setitem(sys.modules, "e2b", None)  # as if `pip install hutch` without the extra
    with pytest.raises(E2bUnavailable, match=r"needs E2B's SDK .*pip install 'hutch\[e2b\]'"):
        Workspace(backend="e2b", api_key=KEY)
