"""Schemathesis fuzzes a live `hutch serve` from its own /openapi.json, on the production profile: every
operation, a fixed seed and a bounded number of examples per operation, three checks: no answer
is a server error (5xx), every JSON answer is the documented envelope (its ``data`` as the
route's schema has it), and a request the document forbids (negative data: a wrong type, a
number past a limit, a missing required field) is refused with a 4xx, not accepted."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.services import drop_database, drop_topics, fresh_database, kafka_url
from tests.system.server import KEY, Server

CONFIG = Path(__file__).with_name("schemathesis.toml")
SEED = 20261125
SSH_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIC/1Rr6FP4rnldeo8MVNjQS92985lw2P6EnTUezYkIoT fuzz"
EXAMPLES = 5  # per operation and phase (~90 operations): 8 took 40 s of the 30-minute budget


# The production profile only: the wire's parsing and answers are the same code on both, and
# PostgreSQL is the stricter store (a NUL, a number past a bigint): what the fuzzing found
# (test_fuzz_findings.py) was a 500 on both profiles or on PostgreSQL alone, never on the embedded
# one alone. The embedded profile took another 55-60 s (run1.log); test_fuzz_findings.py and
# test_wire_schemas.py hold the wire on it.
@pytest.fixture(params=["production"])
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Server]:
    env: dict[str, str] = {}
    cleanup = []
    if request.param == "production":
        url, name = asyncio.run(fresh_database("fuzz"))
        log = kafka_url("fuzz")
        env = {"HUTCH_EVENT_LOG": log, "HUTCH_STORE": url}
        cleanup = [lambda: asyncio.run(drop_database(name)), lambda: asyncio.run(drop_topics(log))]
    data = tmp_path / "data"
    data.mkdir()
    srv = Server(data, driver="fake", **env).start()
    try:
        yield srv
    finally:
        srv.stop()
        for step in cleanup:
            step()


def schemathesis() -> list[str]:
    exe = shutil.which("st") or shutil.which("schemathesis")
    if exe is None:
        pytest.fail("schemathesis is not installed: pip install -e '.[test]' (scripts/install --dev does)",
                    pytrace=False)
    return [exe]


@pytest.mark.timeout(600)  # a guard against a hang, not a measure: a profile takes 1-3 minutes
def test_no_server_error_and_every_answer_fits_the_schema(server: Server, tmp_path: Path) -> None:
    # Real ids for the path parameters, so the fuzzing gets past "404 no such sandbox".
    made = server.data("POST", "/sandbox", {"runtime": "base:latest"})
    sid, token = made["sandboxId"], made["auditStreamUrl"].rsplit("/", 1)[1]
    ran = server.data("POST", f"/sandbox/{sid}/execute", {"command": ["echo", "hi"]})
    ex, out = ran["executionId"], ran["stdoutStreamUrl"].rsplit("/", 1)[1]
    snap = server.data("POST", f"/sandbox/{sid}/snapshot", {"name": "fuzz", "public": True})["snapshotId"]
    checkpoint = server.data("POST", f"/sandbox/{sid}/checkpoint", {"name": "fuzz"})["id"]
    key = server.data("POST", "/keys", {"role": "member"})["id"]
    project = server.data("POST", "/projects", {"name": "fuzz"})["id"]
    ssh_key = server.data("POST", "/ssh-keys", {"publicKey": SSH_KEY})["id"]
    job = server.data("POST", f"/sandbox/sandboxes/{sid}/jobs", {"command": ["sleep", "1"]})["jobId"]
    # The deletes get ids of their own: destroying the shared sandbox or snapshot early would
    # leave every later operation on it a 404, its valid bodies and its answers' shapes untried.
    doomed_sid = server.data("POST", "/sandbox", {"runtime": "base:latest"})["sandboxId"]
    doomed_snap = server.data("POST", f"/sandbox/{sid}/snapshot", {"name": "doomed"})["snapshotId"]
    config = tmp_path / "schemathesis.toml"
    config.write_text(CONFIG.read_text() + f"""
[parameters]
"path.sandbox_id" = "{sid}"
"path.execution_id" = "{ex}"
"path.snapshot_id" = "{snap}"
"path.job_id" = "{job}"
"path.checkpoint_id" = "{checkpoint}"
"path.key_id" = "{key}"
"path.project_id" = "{project}"
"path.ssh_key_id" = "{ssh_key}"
"path.stream_id" = "{out}"
"path.token" = "{token}"
"path.ref" = "{snap}"
"path.org_id" = "org_local"

# The audit stream follows the sandbox's events until it ends unless told not to.
[[operations]]
include-path = "/streams/audit/{{sandbox_id}}/{{token}}"
parameters = {{ "query.follow" = "false" }}

[[operations]]
include-method = "DELETE"
include-path = "/sandbox/{{sandbox_id}}"
parameters = {{ "path.sandbox_id" = "{doomed_sid}" }}

[[operations]]
include-method = "DELETE"
include-path = "/sandbox/snapshots/{{snapshot_id}}"
parameters = {{ "path.snapshot_id" = "{doomed_snap}" }}
""")
    report = tmp_path / "junit.xml"
    cmd = [*schemathesis(), "--config-file", str(config), "run", f"{server.url}/openapi.json",
           "--checks", "not_a_server_error,response_schema_conformance,negative_data_rejection",
           "--mode", "all",
           "--header", f"Authorization: Bearer {KEY}",
           "--seed", str(SEED), "--max-examples", str(EXAMPLES), "--workers", "1",
           "--phases", "examples,coverage,fuzzing",
           "--request-timeout", "30", "--no-color", "--continue-on-failure",
           "--report", "junit", "--report-junit-path", str(report),
           # The terminal (a websocket) and the live feed (server-sent events) stay open by
           # design: a fuzzer's request would wait for them to end.
           "--exclude-path-regex", r"^/(sandbox/\{sandbox_id\}/terminal|app/live)$"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=tmp_path)  # its cache there
    tail = (proc.stdout + proc.stderr)[-6000:]
    print(proc.stdout + proc.stderr, file=sys.stderr)  # every failure, when run with -s
    assert proc.returncode == 0, f"schemathesis found problems (exit {proc.returncode}):\n{tail}\n" \
                                 f"server log:\n{server.log.read_text()[-3000:]}"
    assert report.is_file() and "<testsuite" in report.read_text()
