"""bench/phases.py: a server run with HUTCH_PHASES=1 reports the request path's phases; one
run without it writes no spans at all.

On the local driver, so not in the quick tier; one execute after the warm-up keeps it to a few
seconds.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.system.server import Server

ROOT = Path(__file__).resolve().parents[2]
PHASES = ("auth and tenancy", "body: read, parse and check", "record: append (StartExecution)",
          "record: projection wait (FinishExecution)", "eventlog: sqlite INSERT + COMMIT (WAL fsync), in its thread",
          "streams: open both", "streams: close both", "driver: exec, whole", "zygote: request to the command's exec",
          "long-poll: held", "request POST /sandbox/{sandbox_id}/execute",
          "request GET /sandbox/execution/{execution_id}")


def test_one_execute_is_broken_down_into_the_request_paths_phases() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "phases.py"), "--n", "1", "--scenario", "execute"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-4000:]
    assert re.search(r"^execute: client-side p50 \d+\.\d ms, p90 \d+\.\d ms; bare p50 \d+\.\d ms", out.stdout, re.M), \
        out.stdout
    rows = dict(re.findall(r"^\| ([^|]+) \| (\d+\.\d\d) \| \d+\.\d{3} \| \d+\.\d{3} \|$", out.stdout, re.M))
    missing = [p for p in PHASES if p not in rows]
    assert missing == [], out.stdout
    assert float(rows["driver: exec, whole"]) == 1.0  # one per execute, the warm-ups' included


def test_without_the_flag_the_server_writes_no_spans(tmp_path: Path) -> None:
    server = Server(tmp_path / "data", HUTCH_PHASES="0").start()
    try:
        assert server.call("GET", "/sandbox")[0] == 200
    finally:
        server.stop()
    assert not (tmp_path / "data" / "phases.json").exists()
