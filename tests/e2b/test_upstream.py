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
# embedded-profile server, their async twins against a production-profile one. The sync half
# finds the server by E2B_API_URL and E2B_SANDBOX_URL, but for the tests of HOSTED, run apart
# by E2B_DOMAIN; the async half finds it by E2B_DOMAIN alone (host routing over TLS), as
# E2B's cloud is found. Each way of reaching hutch is so judged by E2B's own tests.
PASSING_SYNC = 153
PASSING_SYNC_HOSTED = 6
PASSING_ASYNC = 157


def _lines(name: str) -> list[str]:
    text = (UPSTREAM / name).read_text()
    return [line.split("#", 1)[0].strip() for line in text.splitlines() if line.split("#", 1)[0].strip()]


def _start(e2b_server: E2bServer, report: Path, half: str, *, hosted: bool,
           only: list[str] | None = None) -> subprocess.Popen[str]:
    """E2B's pytest on the ``half`` (sync or async) of CHOSEN (or ``only`` these tests), less
    EXCLUDED, against ``e2b_server``: by its domain when ``hosted``, else by its two URLs, less HOSTED."""
    chosen = only or [path for path in _lines("CHOSEN") if path.startswith(f"{half}/")]
    left_out = _lines("EXCLUDED") + ([] if hosted else _lines("HOSTED"))
    deselect = [arg for test in left_out if test.startswith(f"{half}/") for arg in ("--deselect", test)]
    # Only the plugins E2B's tests use: every other installed one (hypothesis, aiohttp's, ...)
    # cost each run about 5 s of start on the shared 2 cores.
    env = {k: v for k, v in os.environ.items() if not k.startswith("E2B_")}
    env.update(PYTHONPATH="", PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
    if hosted:
        env.update(e2b_server.domain_env())
    else:
        env.update(E2B_API_URL=e2b_server.url, E2B_SANDBOX_URL=e2b_server.url, E2B_API_KEY=KEY)
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
    hosted_sync = [test for test in _lines("HOSTED") if test.startswith("sync/")]
    runs = {half: (_start(server, tmp_path / f"{half}.xml", half, hosted=hosted), tmp_path / f"{half}.xml", passing)
            for half, server, passing, hosted in (("sync", e2b_embedded_server, PASSING_SYNC, False),
                                                  ("async", e2b_production_server, PASSING_ASYNC, True))}
    runs["sync (by E2B_DOMAIN)"] = (_start(e2b_embedded_server, tmp_path / "hosted.xml", "sync", hosted=True,
                                           only=hosted_sync),
                                    tmp_path / "hosted.xml", PASSING_SYNC_HOSTED)
    wrong = [v for half, (run, report, passing) in runs.items() if (v := _verdict(half, run, report, passing))]
    assert not wrong, "\n\n".join(wrong)
