"""The judge of issue 36: E2B's own python-sdk tests (kept under tests/e2b/upstream/, fetched
from e2b-dev/E2B at the commit its README names) run unchanged against this module's hutch
servers with the real SDK: the sync tests on the embedded profile, their async twins on the
production one (Kafka and PostgreSQL), so both profiles are judged in about the time one
was. The files in upstream/CHOSEN must pass but for the tests upstream/EXCLUDED names, each
with its reason; the counts that passed are asserted, so a test that stops running is
noticed as much as one that fails."""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from tests.e2b.conftest import E2bServer
from tests.system.server import KEY

UPSTREAM = Path(__file__).resolve().parent / "upstream"
# Tests of CHOSEN, less EXCLUDED, that pass (README.md says which): the sync ones against an
# embedded-profile server, their async twins against a production-profile one.
PASSING_SYNC = 150
PASSING_ASYNC = 148


def _lines(name: str) -> list[str]:
    text = (UPSTREAM / name).read_text()
    return [line.split("#", 1)[0].strip() for line in text.splitlines() if line.split("#", 1)[0].strip()]


def _start(e2b_server: E2bServer, report: Path, half: str) -> subprocess.Popen[str]:
    """E2B's pytest on the ``half`` (sync or async) of CHOSEN, less EXCLUDED, against ``e2b_server``."""
    chosen = [path for path in _lines("CHOSEN") if path.startswith(f"{half}/")]
    deselect = [arg for test in _lines("EXCLUDED") if test.startswith(f"{half}/") for arg in ("--deselect", test)]
    # Only the plugins E2B's tests use: every other installed one (hypothesis, aiohttp's, ...)
    # cost each run about 5 s of start on the shared 2 cores.
    env = {**os.environ, "E2B_API_URL": e2b_server.url, "E2B_SANDBOX_URL": e2b_server.url, "E2B_API_KEY": KEY,
           "PYTHONPATH": "", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    env.pop("E2B_DEBUG", None)
    env.pop("E2B_DOMAIN", None)
    return subprocess.Popen(
        [sys.executable, "-m", "pytest", "-c", "pytest.ini", "--rootdir", ".", "-p", "no:cacheprovider",
         "-p", "pytest_asyncio.plugin", "-p", "pytest_timeout", "-q",
         "-o", "timeout=60", "--durations=10", f"--junitxml={report}", *chosen, *deselect],
        cwd=UPSTREAM, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _verdict(half: str, run: subprocess.Popen[str], report: Path, passing: int) -> str | None:
    """What is wrong with the run of ``half`` (None: every test passed, ``passing`` of them)."""
    try:
        out, _ = run.communicate(timeout=900)
    finally:
        run.kill()
    if not report.exists():
        return f"{half}: no report\n{out[-3000:]}"
    suite = ET.parse(report).getroot().find("testsuite")
    if suite is None:
        return f"{half}: an empty report\n{out[-3000:]}"
    counts = {k: int(suite.get(k, "0")) for k in ("tests", "failures", "errors", "skipped")}
    failed = [f"{case.get('classname')}::{case.get('name')}" for case in suite.iter("testcase")
              if case.find("failure") is not None or case.find("error") is not None]
    if failed:
        return f"{half}: {failed}\n{out[-6000:]}"
    if counts["tests"] - counts["skipped"] != passing:
        return f"{half}: {counts}, expected {passing} to pass\n{out[-2000:]}"
    print(out[-1500:])  # the slowest tests, shown with -s
    return None


def test_the_chosen_e2b_tests_pass_on_both_profiles(e2b_embedded_server: E2bServer,
                                                    e2b_production_server: E2bServer, tmp_path: Path) -> None:
    """The two halves run at once: most of their time is the tests' own waiting (timeouts,
    sleeping commands), so together they take about what one took alone."""
    runs = {half: (_start(server, tmp_path / f"{half}.xml", half), tmp_path / f"{half}.xml", passing)
            for half, server, passing in (("sync", e2b_embedded_server, PASSING_SYNC),
                                          ("async", e2b_production_server, PASSING_ASYNC))}
    wrong = [v for half, (run, report, passing) in runs.items() if (v := _verdict(half, run, report, passing))]
    assert not wrong, "\n\n".join(wrong)
