"""A type checker sees the blocking client's methods: hutch/sync.pyi is current, and mypy types
a script's calls through it (a typo or a wrong result type is an error, not Any)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent("""
    from hutch import SyncSandboxClient
    from hutch.models import Execution, SandboxInfo

    with SyncSandboxClient() as client:
        with client.create(runtime="python:3.13") as sandbox:
            done: Execution = sandbox.execute(["true"])
            info: SandboxInfo = client.get(sandbox.id)
            forks = sandbox.fork(2)
            first: str = forks[0].id
            chunks: list[bytes] = list(sandbox.read_file("/etc/hostname"))
            wrong: int = sandbox.execute(["true"])
            sandbox.excute(["true"])
""")


def test_the_stub_is_what_the_generator_writes_now() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "sync-stub"), "--check"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_mypy_types_the_blocking_client_through_the_stub() -> None:
    done = subprocess.run([sys.executable, "-m", "mypy", "--no-error-summary", "-c", SCRIPT],
                          cwd=ROOT, capture_output=True, text=True)
    errors = [line for line in done.stdout.splitlines() if ": error:" in line]
    # Exactly the two wrong lines: the typed ones above them are accepted as typed.
    assert len(errors) == 2, done.stdout + done.stderr
    assert 'Incompatible types in assignment (expression has type "Execution"' in errors[0]
    assert '"SyncSandbox" has no attribute "excute"' in errors[1]
