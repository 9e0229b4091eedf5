"""bench/compare.py: two commits' servers timed in turns, one table of ratios.

On the local driver (a real server per commit), so not in the quick tier; n=2 keeps it to a
few seconds.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NUMBER = r"\d+\.\d+"


def compare(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, str(ROOT / "bench" / "compare.py"), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], check=True, capture_output=True, text=True).stdout.strip()


def checkouts() -> set[str]:
    """compare.py's worktrees of this repository (another run's may come and go meanwhile)."""
    return {line.split()[0] for line in git("worktree", "list").splitlines() if "hutch-compare-" in line}


def _from(ratio: float, b: float, a: float) -> bool:
    """``ratio`` (printed to 0.001) is B/A of the unrounded values behind ``b`` and ``a``
    (printed to 0.1 ms): a fixed tolerance failed at ~6 ms, where the rounding alone moves
    the ratio by 0.012 (0.893 printed against 5.9 / 6.7)."""
    return (b - 0.05) / (a + 0.05) - 0.0005 <= ratio <= (b + 0.05) / (a - 0.05) + 0.0005


def test_head_against_its_parent_prints_both_commits_and_a_row_of_ratios() -> None:
    before = checkouts()
    out = compare("HEAD~1", "HEAD", "--bench", "execute-true", "-n", "2")
    assert out.returncode == 0, out.stderr[-4000:]
    lines = out.stdout.splitlines()
    assert lines[0].startswith("hutch compare: embedded profile, local driver"), lines[0]
    assert lines[1] == f"A = {git('rev-parse', 'HEAD~1')[:10]} {git('log', '-1', '--format=%s', 'HEAD~1')}"
    assert lines[2] == f"B = {git('rev-parse', 'HEAD')[:10]} {git('log', '-1', '--format=%s', 'HEAD')}"
    assert lines[3] == "| figure | A median | A p90 | B median | B p90 | B/A median | B/A p90 | B/A paired |"
    cells = re.fullmatch(rf"\| execute `true` in a live sandbox \(HTTP\), ms \| ({NUMBER}) \| ({NUMBER}) \| "
                         rf"({NUMBER}) \| ({NUMBER}) \| ({NUMBER}) \| ({NUMBER}) \| ({NUMBER}) \|", lines[5])
    assert cells is not None, lines[5]
    a_med, a_p90, b_med, b_p90, ratio, ratio_p90, _ = (float(c) for c in cells.groups())
    assert 0 < a_med <= a_p90 and 0 < b_med <= b_p90
    assert _from(ratio, b_med, a_med) and _from(ratio_p90, b_p90, a_p90)
    assert len(lines) == 6
    assert checkouts() <= before  # its own checkouts are gone


def test_a_name_that_is_no_commit_is_refused_by_name() -> None:
    out = compare("HEAD", "no-such-commit-xyz", "--bench", "execute-true", "-n", "2")
    assert out.returncode != 0
    assert "'no-such-commit-xyz' is not a commit" in out.stderr, out.stderr


def test_a_run_stopped_midway_removes_its_checkouts_and_servers() -> None:
    before = checkouts()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, str(ROOT / "bench" / "compare.py"), "HEAD", "HEAD", "--bench",
                             "throughput", "--seconds", "30", "--rounds", "1"],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while len(servers_of(proc.pid)) < 2:  # both servers up: the throughput round starts
            assert proc.poll() is None, proc.communicate()[1][-4000:]
            assert time.monotonic() < deadline, "no server started within 60 s"
            time.sleep(0.2)
        assert checkouts() - before, "no checkout of its own while it runs"
        time.sleep(1)
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
    assert checkouts() <= before
    assert servers_of(proc.pid) == []


def servers_of(pid: int) -> list[int]:
    """The `python -m hutch.api` children of ``pid`` still alive."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes()
        except OSError:
            continue
        if int(fields[1]) == pid and b"hutch.api" in cmdline and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return found
