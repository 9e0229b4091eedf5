# ruff: noqa: ASYNC240  (an example: a small file written once, blocking is fine)
"""A code agent's loop on a hutch Workspace, scripted (no model needed): write a file, run its
tests, read the failure, fix, rerun, snapshot; then, in a new process, resume and go on.

    python examples/agent_loop.py turn1 state.json     # prints each step; saves the workspace
    python examples/agent_loop.py turn2 state.json     # a new process: resumes it and extends it

The "model" is a list of tool calls (OpenAI-shaped) answered by ``workspace.tools()``; a real
agent would send the tool definitions to its model and dispatch what comes back the same way.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from hutch import Workspace, WorkspaceSnapshot

TESTS = "from calc import add\nassert add(2, 3) == 5, add(2, 3)\nprint('tests pass')\n"


def call(name: str, **args: object) -> dict:
    return {"id": f"call-{name}", "function": {"name": name, "arguments": json.dumps(args)}}


async def turn1(state: Path) -> None:
    # No .pyc files: a fix written within the same second as the bug, at the same size, would
    # otherwise run the bug's cached bytecode (Python checks mtime and size only).
    async with Workspace(language="python", files={"test_calc.py": TESTS}, env={"PYTHONDONTWRITEBYTECODE": "1"}) as ws:
        tools = ws.tools()
        script = [
            call("write_file", path="calc.py", contents="def add(a, b):\n    return a - b\n"),  # a bug
            call("run_code", code="import runpy; runpy.run_path('test_calc.py')"),
            call("write_file", path="calc.py", contents="def add(a, b):\n    return a + b\n"),  # the fix
            call("run_code", code="import runpy; runpy.run_path('test_calc.py')"),
        ]
        for step in script:
            reply = json.loads((await tools.dispatch(step))["content"])
            last_error = ((reply.get("stderr") or "").strip().splitlines() or [""])[-1]  # what the model reads
            print(step["function"]["name"], "->", reply.get("exit_code", reply), last_error)
        state.write_text(json.dumps((await ws.snapshot()).to_dict()))
        print("saved", state)


async def turn2(state: Path) -> None:
    ws = await Workspace.resume(WorkspaceSnapshot.from_dict(json.loads(state.read_text())), language="python")
    try:
        print("calc.py:", (await ws.read_file("calc.py") or "").strip().splitlines()[-1].strip())
        result = await ws.run("import runpy; runpy.run_path('test_calc.py')")
        print("tests after resume ->", result.exit_code, result.stdout.strip())
    finally:
        await ws.close()


if __name__ == "__main__":
    asyncio.run({"turn1": turn1, "turn2": turn2}[sys.argv[1]](Path(sys.argv[2])))
