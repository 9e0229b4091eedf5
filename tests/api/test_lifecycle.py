"""Pause/resume, jobs and timeouts through the wire."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.api.conftest import AUTH, REAL, STORE, Api


async def new_sandbox(api: Api, **body: object) -> str:
    return (await api.call("POST", "/sandbox", json=body, expect=201))["data"]["sandboxId"]


async def run(api: Api, sid: str, *command: str) -> dict:
    ex = await api.call("POST", f"/sandbox/{sid}/execute", json={"command": list(command)})
    final = await api.wait_execution(ex["data"]["executionId"])
    final["autoResumed"] = ex.get("autoResumed")
    final["stdout"] = await api.stream(ex["data"]["stdoutStreamUrl"])
    return final


@pytest.mark.runs_on(*STORE, *REAL)  # the drivers' pause and resume; auto-resume in both stores
async def test_pause_keeps_files_and_execute_auto_resumes(api: Api) -> None:
    sid = await new_sandbox(api, timeout={"paused": "1h"})
    assert (await run(api, sid, "sh", "-c", "echo kept > f.txt"))["exitCode"] == 0
    paused = await api.call("POST", f"/sandbox/{sid}/pause")
    assert paused["sandboxId"] == sid and paused["status"] == "paused" and paused["terminatesAt"].endswith("Z")
    assert (await api.data("GET", f"/sandbox/{sid}"))["status"] == "paused"
    await api.call("POST", f"/sandbox/{sid}/pause")  # idempotent
    result = await run(api, sid, "cat", "f.txt")
    assert result["autoResumed"] is True and result["stdout"] == b"kept\n"
    assert (await api.data("GET", f"/sandbox/{sid}"))["status"] == "idle"
    await api.call("POST", f"/sandbox/{sid}/pause")
    await api.call("POST", f"/sandbox/{sid}/resume")
    assert (await run(api, sid, "cat", "f.txt"))["autoResumed"] is False
    types = [e["type"] for e in (await api.data("GET", f"/sandbox/sandboxes/{sid}/events?limit=100"))["events"]]
    assert types.count("pause") == 2 and types.count("resume") == 2
    auto = [e["event"] for e in (await api.data("GET", f"/sandbox/sandboxes/{sid}/events?limit=100"))["events"] if e["type"] == "resume"]
    assert [a.get("auto", False) for a in auto] == [True, False]


@pytest.mark.runs_on("local-embedded", "local-production", "node-embedded")
async def test_a_filesystem_only_pause_ends_its_commands_keeps_its_files_and_resumes_as_a_new_boot(api: Api) -> None:
    """``{"memory": false}``: every process ends (a running command is cancelled, saying why, as
    a stop ends one), the files stay; the pause's event records the mode; the resume (here an
    execute's auto-resume) is a new boot: a fresh /proc/sys/kernel/random/boot_id."""
    sid = await new_sandbox(api)
    assert (await run(api, sid, "sh", "-c", "echo kept > f.txt"))["exitCode"] == 0
    boot = (await run(api, sid, "cat", "/proc/sys/kernel/random/boot_id"))["stdout"]
    busy = await api.data("POST", f"/sandbox/{sid}/execute", json={"command": ["sleep", "300"]})
    await asyncio.sleep(0.3)
    paused = await api.call("POST", f"/sandbox/{sid}/pause", json={"memory": False})
    assert paused["status"] == "paused" and paused["memory"] is False
    ended = await api.wait_execution(busy["executionId"])
    assert ended["status"] == "cancelled" and "paused filesystem-only" in ended["error"], ended
    assert (await api.data("GET", f"/sandbox/{sid}"))["status"] == "paused"
    events = (await api.data("GET", f"/sandbox/sandboxes/{sid}/events?limit=100"))["events"]
    assert [e["event"].get("mode") for e in events if e["type"] == "pause"] == ["filesystem"]
    again = await api.call("POST", f"/sandbox/{sid}/pause")  # paused already, whichever way
    assert again["status"] == "paused"
    result = await run(api, sid, "cat", "f.txt")
    assert result["autoResumed"] is True and result["stdout"] == b"kept\n"
    after = (await run(api, sid, "cat", "/proc/sys/kernel/random/boot_id"))["stdout"]
    assert len(after.strip()) == 36 and after != boot
    await api.call("POST", f"/sandbox/{sid}/pause")  # a memory pause keeps the boot
    await api.call("POST", f"/sandbox/{sid}/resume")
    assert (await run(api, sid, "cat", "/proc/sys/kernel/random/boot_id"))["stdout"] == after


@pytest.mark.runs_on(*STORE, "nomad-production")  # drivers without it, and a bad value
async def test_a_filesystem_only_pause_a_driver_cannot_do_is_refused_naming_it(api: Api, driver_name: str) -> None:
    sid = await new_sandbox(api)
    err = await api.call("POST", f"/sandbox/{sid}/pause", json={"memory": "no"}, expect=400)
    assert "memory: expected true or false" in err["message"]
    err = await api.call("POST", f"/sandbox/{sid}/pause", json={"memory": False}, expect=501)
    assert f"the {driver_name} driver cannot pause a sandbox filesystem-only" in err["message"], err
    assert (await api.data("GET", f"/sandbox/{sid}"))["status"] == "idle"  # no quiet memory pause
    # The Agentuity wire's rule (api/body_fields.py): another spelling of its field is refused.
    err = await api.call("POST", f"/sandbox/{sid}/pause", json={"memorys": False}, expect=400)
    assert "memorys" in err["message"] and "memory" in err["message"], err


@pytest.mark.runs_on(*STORE)  # the fake driver freezes no running command (local and nomad do)
async def test_illegal_pause_and_resume_are_refused_naming_why(api: Api, driver_name: str) -> None:
    sid = await new_sandbox(api)
    err = await api.call("POST", f"/sandbox/{sid}/resume", expect=200)  # idle: already awake
    assert err["success"] is True
    ex = await api.data("POST", f"/sandbox/{sid}/execute", json={"command": ["sleep", "5"]})
    err = await api.call("POST", f"/sandbox/{sid}/pause", expect=501)
    assert f"has commands running: the {driver_name} driver" in err["message"] and err["code"] == "NOT_SUPPORTED"
    # Decided by the service against the record, under the lock a command's start is recorded
    # under (not by the driver, which may not hold a command recorded a moment ago yet).
    assert "pauses a sandbox with none (it cannot hold a frozen command's time limit)" in err["message"]
    assert (await api.data("GET", f"/sandbox/{sid}"))["status"] == "running"  # nothing half-made
    await api.call("DELETE", f"/sandbox/{sid}")
    await api.wait_execution(ex["executionId"])
    await api.call("POST", f"/sandbox/{sid}/pause", expect=404)
    await api.call("POST", "/sandbox/sbx_nope/resume", expect=404)


@pytest.mark.runs_on("local-embedded", "local-production", "nomad-production")  # the freezer and the run clock
async def test_a_command_is_paused_with_its_sandbox_its_time_limit_standing_still(api: Api) -> None:
    """Paused with a command running, the sandbox is ``paused`` and the command ``running``,
    frozen: paused past its 4 s limit, it resumes and ends well (the paused time was not its).
    A sleep's deadline is the clock's, which runs while the sandbox is frozen: the sleep that
    was frozen ends at once on resume, so a second one keeps the command running after it (with
    only the first, the sandbox was idle by the time the test asked). The limit's 4 s leave
    ample room for its start, the pause and that second second on a loaded machine."""
    sid = await new_sandbox(api)
    ex = await api.data("POST", f"/sandbox/{sid}/execute",
                        json={"command": ["sh", "-c", "sleep 2; sleep 1; echo done"], "timeout": "4s"})
    paused = await api.call("POST", f"/sandbox/{sid}/pause")
    assert paused["status"] == "paused"
    await asyncio.sleep(4.5)
    assert (await api.data("GET", f"/sandbox/execution/{ex['executionId']}"))["status"] == "running"
    await api.call("POST", f"/sandbox/{sid}/resume")
    assert (await api.data("GET", f"/sandbox/{sid}"))["status"] == "running"
    final = await api.wait_execution(ex["executionId"])
    assert (final["status"], final["exitCode"]) == ("completed", 0), final
    assert await api.stream(ex["stdoutStreamUrl"]) == b"done\n"
    # Its limit still holds, on the time it ran: a command paused and resumed still times out.
    ex = await api.data("POST", f"/sandbox/{sid}/execute", json={"command": ["sleep", "60"], "timeout": "2s"})
    await api.call("POST", f"/sandbox/{sid}/pause")
    await api.call("POST", f"/sandbox/{sid}/resume")
    final = await api.wait_execution(ex["executionId"])
    assert final["status"] == "timeout" and final["durationMs"] < 10_000, final
    await api.call("DELETE", f"/sandbox/{sid}")


@pytest.mark.runs_on("local-embedded", "local-production", "nomad-production")  # a frozen process tree killed
async def test_a_frozen_command_is_cancelled_and_a_destroy_ends_the_rest(api: Api) -> None:
    """A cancel of a paused sandbox's command ends it (local: a thaw-kill of its tree alone;
    nomad: SIGKILLed frozen, its processes die as the sandbox thaws), the sandbox staying
    paused, its other command frozen; a destroy then ends that one too."""
    sid = await new_sandbox(api)
    count = ["sh", "-c", "i=0; while :; do i=$((i+1)); echo $i > /tmp/count; sleep 0.1; done"]
    counter = await api.data("POST", f"/sandbox/{sid}/execute", json={"command": count})
    doomed = await api.data("POST", f"/sandbox/{sid}/execute", json={"command": ["sh", "-c", "sleep 300 & sleep 301"]})
    await asyncio.sleep(0.5)
    await api.call("POST", f"/sandbox/{sid}/pause")
    done = await api.data("POST", f"/sandbox/execution/{doomed['executionId']}/cancel")
    assert done["status"] == "cancelled" and done["durationMs"] < 10_000, done
    assert (await api.data("GET", f"/sandbox/{sid}"))["status"] == "paused"
    await api.call("POST", f"/sandbox/{sid}/resume")
    first = await run(api, sid, "cat", "/tmp/count")
    ps = await run(api, sid, "ps", "-eo", "args")
    assert b"sleep 30" not in ps["stdout"] and b"while" in ps["stdout"], ps["stdout"]
    await asyncio.sleep(0.5)
    assert int((await run(api, sid, "cat", "/tmp/count"))["stdout"]) > int(first["stdout"])  # thawed, counting
    await api.call("POST", f"/sandbox/{sid}/pause")
    await api.call("DELETE", f"/sandbox/{sid}")
    job = await api.data("GET", f"/sandbox/execution/{counter['executionId']}?wait=10s")
    assert job["status"] == "cancelled", job


@pytest.mark.runs_on(*STORE)  # the service's timers over the store
async def test_paused_timeout_terminates(api: Api) -> None:
    sid = await new_sandbox(api, timeout={"paused": "300ms"})
    await api.call("POST", f"/sandbox/{sid}/pause")
    t0 = time.monotonic()
    status = await api.data("GET", f"/sandbox/status/{sid}?waitForStatus=terminated&waitMs=5000")
    assert status["status"] == "terminated" and time.monotonic() - t0 < 2.0
    events = (await api.data("GET", f"/sandbox/sandboxes/{sid}/events?direction=desc&limit=1"))["events"]
    assert events[0]["type"] == "lifecycle:terminated" and "paused timeout" in events[0]["event"]["reason"]


@pytest.mark.runs_on(*STORE)  # the service's timers over the store
async def test_idle_timeout_reaps_promptly_and_activity_defers_it(api: Api) -> None:
    # The idle clock starts when the sandbox becomes idle (its started event), before the
    # create call returns: on a loaded machine the production profile's create tail took
    # over 200 ms once in CI, so 600 ms minus a 400 ms sleep was too tight a margin.
    sid = await new_sandbox(api, timeout={"idle": "1s"})
    await asyncio.sleep(0.3)
    done = await run(api, sid, "true")  # activity: the clock starts again
    status = await api.data("GET", f"/sandbox/status/{sid}?waitForStatus=terminated&waitMs=5000")
    assert status["status"] == "terminated"
    events = (await api.data("GET", f"/sandbox/sandboxes/{sid}/events?limit=100"))["events"]
    end = events[-1]
    assert end["type"] == "lifecycle:terminated" and "idle timeout (1s)" in end["event"]["reason"]
    # Judged on the server's own clock, so a slow test client cannot blur it: the idle
    # clock restarted at the command's end, and the reaper fired right after 1 s.
    finished = next(e for e in events if e["type"] == "execution:finished")["createdAt"]
    idle_for = _seconds_between(finished, end["createdAt"])
    assert 1.0 <= idle_for < 1.5, idle_for
    assert done["completedAt"]
    err = await api.call("POST", f"/sandbox/{sid}/execute", json={"command": ["true"]}, expect=409)
    assert "terminated" in err["message"]


def _seconds_between(a: str, b: str) -> float:
    import datetime as dt

    parse = lambda s: dt.datetime.fromisoformat(s.replace("Z", "+00:00"))  # noqa: E731
    return (parse(b) - parse(a)).total_seconds()


@pytest.mark.runs_on(*STORE)  # the service's timers over the store
async def test_running_commands_keep_a_sandbox_from_idling_out(api: Api) -> None:
    # Idle 1 s, not less: the clock starts before the create call returns (see above).
    sid = await new_sandbox(api, timeout={"idle": "1s"})
    ex = await api.data("POST", f"/sandbox/{sid}/execute", json={"command": ["sleep", "2"]})
    final = await api.wait_execution(ex["executionId"])
    assert final["status"] == "completed"
    status = await api.data("GET", f"/sandbox/status/{sid}?waitForStatus=terminated&waitMs=5000")
    assert status["status"] == "terminated"


@pytest.mark.runs_on(*STORE, *REAL)  # real processes side by side, stopped
async def test_jobs_run_beside_executions_and_stop(api: Api) -> None:
    sid = await new_sandbox(api)
    job = (await api.call("POST", f"/sandbox/sandboxes/{sid}/jobs", json={"command": ["sh", "-c", "echo started; sleep 30"]}, expect=201))["data"]
    assert job["jobId"].startswith("job_") and job["status"] == "running" and job["stdoutStreamUrl"]
    quick = (await api.call("POST", f"/sandbox/sandboxes/{sid}/jobs", json={"command": ["sh", "-c", "exit 3"]}, expect=201))["data"]
    assert (await run(api, sid, "echo", "beside"))["stdout"] == b"beside\n"  # an execute while jobs run
    for _ in range(100):
        done = await api.data("GET", f"/sandbox/sandboxes/{sid}/jobs/{quick['jobId']}")
        if done["status"] != "running":
            break
        await asyncio.sleep(0.05)
    assert done["status"] == "failed" and done["exitCode"] == 3
    listed = (await api.data("GET", f"/sandbox/sandboxes/{sid}/jobs"))["jobs"]
    assert {j["jobId"] for j in listed} == {job["jobId"], quick["jobId"]}
    assert len((await api.data("GET", f"/sandbox/sandboxes/{sid}/jobs?limit=1"))["jobs"]) == 1
    execs = (await api.data("GET", f"/sandbox/sandboxes/{sid}/executions"))["executions"]
    assert all(e["executionId"].startswith("exec_") for e in execs)  # jobs are not executions on the wire
    stopped = await api.data("DELETE", f"/sandbox/sandboxes/{sid}/jobs/{job['jobId']}")
    assert stopped["status"] == "cancelled" and stopped["completedAt"]
    assert (await api.stream(stopped["stdoutStreamUrl"])).startswith(b"started")
    again = await api.data("DELETE", f"/sandbox/sandboxes/{sid}/jobs/{job['jobId']}?force=true")
    assert again["status"] == "cancelled"  # stopping a stopped job is harmless


@pytest.mark.runs_on(*STORE)  # refusals and lookups
async def test_job_errors(api: Api) -> None:
    sid = await new_sandbox(api)
    err = await api.call("POST", f"/sandbox/sandboxes/{sid}/jobs", json={}, expect=400)
    assert "command" in err["message"]
    await api.call("GET", f"/sandbox/sandboxes/{sid}/jobs/job_nope", expect=404)
    await api.call("POST", "/sandbox/sandboxes/sbx_nope/jobs", json={"command": ["true"]}, expect=404)
    ex = await api.data("POST", f"/sandbox/{sid}/execute", json={"command": ["true"]})
    await api.call("GET", f"/sandbox/sandboxes/{sid}/jobs/{ex['executionId']}", expect=404)  # not a job


@pytest.mark.runs_on(*STORE)  # the stores' counts
async def test_stats_count_what_ran_in_a_time_range(api: Api) -> None:
    sid = await new_sandbox(api)
    await run(api, sid, "true")
    await run(api, sid, "sh", "-c", "exit 2")
    await api.call("POST", f"/sandbox/sandboxes/{sid}/jobs", json={"command": ["true"]}, expect=201)
    other = await new_sandbox(api)
    await api.call("DELETE", f"/sandbox/{other}")
    stats = await api.data("GET", "/sandbox/stats")
    assert stats["sandboxes"]["created"] == 2
    assert stats["sandboxes"]["byStatus"] in ({"idle": 1, "deleted": 1}, {"running": 1, "deleted": 1})  # the job may still run
    assert stats["executions"]["total"] == 2 and stats["executions"]["byStatus"] == {"completed": 2}
    assert stats["jobs"]["total"] == 1
    empty = await api.data("GET", "/sandbox/stats?start=2000-01-01T00:00:00Z&end=2000-01-02T00:00:00Z")
    assert empty["sandboxes"]["created"] == 0
    err = await api.call("GET", "/sandbox/stats?start=yesterday", expect=400)
    assert "start" in err["message"]


@pytest.mark.runs_on("local-embedded", "nomad-production")  # a paused sandbox's frozen command at its paused timeout
async def test_a_paused_timeout_ends_the_frozen_commands_too(api: Api) -> None:
    """A sandbox paused with a command running, ended at its paused timeout: the frozen
    command ends with it (cancelled), nothing left hanging."""
    sid = await new_sandbox(api, timeout={"paused": "1s"})
    ex = await api.data("POST", f"/sandbox/{sid}/execute", json={"command": ["sh", "-c", "touch started; exec sleep 60"]})
    # Running before the pause: the execute answers once the start is recorded, and a pause that
    # froze the sandbox before the command was launched ended it with no execution:finished of
    # its own (4 runs in 40) instead of frozen while it ran.
    deadline = time.monotonic() + 10
    while (await api.client.get(f"/fs/{sid}?path=started", headers=AUTH)).status != 200:
        assert time.monotonic() < deadline, "the command did not start within 10 s"
        await asyncio.sleep(0.02)
    await api.call("POST", f"/sandbox/{sid}/pause")
    status = await api.data("GET", f"/sandbox/status/{sid}?waitForStatus=terminated&waitMs=10000")
    assert status["status"] == "terminated"
    final = await api.wait_execution(ex["executionId"])
    assert final["status"] == "cancelled", final
    events = (await api.data("GET", f"/sandbox/sandboxes/{sid}/events?limit=100"))["events"]
    assert events[-1]["type"] == "lifecycle:terminated" and "paused timeout" in events[-1]["event"]["reason"]
    # Recorded ending before its commands were killed, as a busy sandbox's end is: their
    # clients hear the sandbox ended, not that they were killed (the nomad driver's destroy
    # waits for its commands' execs, as the local driver's does).
    types = [e["type"] for e in events]
    assert types.index("destroy") < types.index("execution:finished"), types
