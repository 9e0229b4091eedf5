"""The wire API on the fake driver: shapes, statuses, errors. The same calls run on the
local driver in tests/api/test_local_profile.py and with the real client in tests/compat."""

from __future__ import annotations

import asyncio
import base64

import pytest
import yarl

from hutch.api.app import ENGINE
from hutch.blobs.output_files import FileOutputStreams
from tests.api.conftest import AUTH, REAL, STORE, WIRE, Api


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


@pytest.mark.runs_on(*WIRE)  # the wire alone
async def test_health_needs_no_key(api: Api) -> None:
    resp = await api.client.get("/healthz")
    assert resp.status == 200


@pytest.mark.runs_on(*WIRE)  # refused before anything else runs
@pytest.mark.parametrize(
    ("headers", "message"),
    [({}, "missing Authorization"), ({"Authorization": "Bearer wrong"}, "invalid API key"),
     ({"Authorization": "Basic abc"}, "Bearer")],
)
async def test_auth_is_required(api: Api, headers: dict[str, str], message: str) -> None:
    resp = await api.client.get("/sandbox", headers=headers)
    body = await resp.json()
    assert resp.status == 401 and body["success"] is False and body["code"] == "UNAUTHORIZED"
    assert message in body["message"]


@pytest.mark.runs_on(*WIRE)  # the catalog is the same on every driver
async def test_runtimes_catalog(api: Api) -> None:
    data = await api.data("GET", "/sandbox/runtimes")
    names = [r["name"] for r in data["runtimes"]]
    assert "base:latest" in names and "python:3.13" in names and data["total"] == len(names)
    for r in data["runtimes"]:
        assert r["id"].startswith("srt_") and r["description"] and isinstance(r["available"], bool)
        assert r["requirements"]["networkEnabled"] is ("agent" in r["tags"])  # agent CLIs call their vendor
    page = await api.data("GET", "/sandbox/runtimes?limit=1&offset=1&direction=desc")
    assert len(page["runtimes"]) == 1


@pytest.mark.runs_on(*STORE, *REAL)  # the whole path: real processes, events in both stores
async def test_interactive_sandbox_end_to_end(api: Api) -> None:
    created = await api.call("POST", "/sandbox", json={"runtime": "base:latest", "name": "dev", "env": {"GREETING": "hi"},
                                                       "resources": {"memory": "256Mi", "cpu": "500m"},
                                                       "metadata": {"team": "a", "n": [1, {"x": True}]}}, expect=201)
    sid = created["data"]["sandboxId"]
    assert sid.startswith("sbx_") and created["data"]["status"] == "idle"

    info = await api.data("GET", f"/sandbox/{sid}")
    assert info["status"] == "idle" and info["runtime"]["name"] == "base:latest" and info["executions"] == 0
    assert info["resources"] == {"memory": "256Mi", "cpu": "500m"} and info["name"] == "dev"
    assert "exitCode" not in info and None not in info.values()
    assert info["metadata"] == {"team": "a", "n": [1, {"x": True}]}

    ex = await api.data("POST", f"/sandbox/{sid}/execute", json={"command": ["sh", "-c", "echo out; echo err >&2; exit 3"]})
    assert ex["executionId"].startswith("exec_") and ex["status"] in ("queued", "running", "completed")
    assert ex["stdoutStreamUrl"].startswith("http://") and ex["stdoutStreamUrl"] != ex["stderrStreamUrl"]
    final = await api.wait_execution(ex["executionId"])
    assert final["status"] == "completed" and final["exitCode"] == 3 and final["command"][0] == "sh"
    assert final["startedAt"] and final["completedAt"] and final["durationMs"] >= 0
    assert await api.stream(ex["stdoutStreamUrl"]) == b"out\n"
    assert await api.stream(ex["stderrStreamUrl"]) == b"err\n"

    env = await api.data("POST", f"/sandbox/{sid}/execute", json={"command": ["printenv", "GREETING"]})
    await api.wait_execution(env["executionId"])
    assert await api.stream(env["stdoutStreamUrl"]) == b"hi\n"

    listed = await api.data("GET", f"/sandbox/sandboxes/{sid}/executions")
    assert [e["executionId"] for e in listed["executions"]] == [env["executionId"], ex["executionId"]]
    assert (await api.data("GET", f"/sandbox/sandboxes/{sid}/executions?limit=1"))["executions"][0]["executionId"] == env["executionId"]

    await api.call("DELETE", f"/sandbox/{sid}")
    await api.call("GET", f"/sandbox/{sid}", expect=404)
    gone = await api.data("GET", f"/sandbox/{sid}?includeDeleted=true")
    assert gone["status"] == "deleted"
    await api.call("DELETE", f"/sandbox/{sid}")  # idempotent
    await api.call("POST", f"/sandbox/{sid}/execute", json={"command": ["echo"]}, expect=404)

    events = (await api.data("GET", f"/sandbox/sandboxes/{sid}/events?limit=100"))["events"]
    types = [e["type"] for e in events]
    assert types == ["create", "lifecycle:started", "execution:started", "execution:finished",
                     "execution:started", "execution:finished", "destroy", "lifecycle:terminated"]
    assert events[0]["event"]["spec"]["env"] == {"GREETING": "***"}  # secrets stay out of the events API
    assert all(e["sandboxId"] == sid and e["eventId"].startswith("evt_") and e["createdAt"].endswith("Z") for e in events)
    desc = (await api.data("GET", f"/sandbox/sandboxes/{sid}/events?direction=desc&limit=2"))["events"]
    assert [e["type"] for e in desc] == ["lifecycle:terminated", "destroy"]


@pytest.mark.runs_on(*STORE, *REAL)  # a oneshot's lifecycle: real process, both stores
async def test_oneshot_runs_files_and_terminates_with_exit_code(api: Api) -> None:
    body = {"runtime": "python:3.13", "command": {"exec": ["cat", "main.py"], "mode": "oneshot",
                                                  "files": [{"path": "main.py", "content": b64("print(1)\n")}]}}
    data = (await api.call("POST", "/sandbox", json=body, expect=201))["data"]
    assert data["executionId"].startswith("exec_") and data["stdoutStreamUrl"] and data["stderrStreamUrl"]
    assert await api.stream(data["stdoutStreamUrl"]) == b"print(1)\n"
    status = await api.data("GET", f"/sandbox/status/{data['sandboxId']}?waitForStatus=terminated,failed&waitMs=10000")
    assert status == {"sandboxId": data["sandboxId"], "status": "terminated", "exitCode": 0}
    ex = await api.wait_execution(data["executionId"])
    assert ex["status"] == "completed" and ex["exitCode"] == 0
    info = await api.data("GET", f"/sandbox/{data['sandboxId']}")
    assert info["mode"] == "oneshot" and info["exitCode"] == 0 and info["stdoutStreamUrl"] == data["stdoutStreamUrl"]
    types = [e["type"] for e in (await api.data("GET", f"/sandbox/sandboxes/{data['sandboxId']}/events"))["events"]]
    assert types[-2:] == ["lifecycle:completed", "lifecycle:terminated"]


@pytest.mark.runs_on("fake-embedded", "local-embedded")
async def test_a_oneshot_status_carries_its_exit_code_once_the_command_ended(
        api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    """Between its command's end and its teardown a one-shot is ``idle``: the real client's
    ``run()`` polls the status every 25 ms until it has an exit code (docs/wire.md 2.2), so
    the answer carries it as soon as it is known, not only once the sandbox is terminated."""
    lifecycle = api.client.server.app[ENGINE].control._lifecycle
    destroy, torn_down = lifecycle.destroy, asyncio.Event()

    async def slow_destroy(sandbox_id: str) -> None:
        await torn_down.wait()  # the sandbox stays idle, its command ended, until the test says
        await destroy(sandbox_id)

    monkeypatch.setattr(lifecycle, "destroy", slow_destroy)
    data = (await api.call("POST", "/sandbox", json={"command": {"exec": ["sh", "-c", "exit 3"], "mode": "oneshot"}},
                           expect=201))["data"]
    assert (await api.wait_execution(data["executionId"]))["exitCode"] == 3
    status = await api.data("GET", f"/sandbox/status/{data['sandboxId']}?waitForStatus=idle,terminated,failed&waitMs=10000")
    assert status == {"sandboxId": data["sandboxId"], "status": "idle", "exitCode": 3}
    torn_down.set()
    status = await api.data("GET", f"/sandbox/status/{data['sandboxId']}?waitForStatus=terminated&waitMs=10000")
    assert status == {"sandboxId": data["sandboxId"], "status": "terminated", "exitCode": 3}
    # An interactive sandbox's last execution's code is not the sandbox's: none while it lives.
    sid = (await api.call("POST", "/sandbox", json={}, expect=201))["data"]["sandboxId"]
    ex = await api.data("POST", f"/sandbox/{sid}/execute", json={"command": ["sh", "-c", "exit 4"]})
    assert (await api.wait_execution(ex["executionId"]))["exitCode"] == 4
    assert await api.data("GET", f"/sandbox/status/{sid}") == {"sandboxId": sid, "status": "idle"}
    await api.call("DELETE", f"/sandbox/{sid}")


@pytest.mark.runs_on(*WIRE, *REAL)  # exit codes are the drivers' (contract-tested)
async def test_oneshot_failure_exit_code_is_reported(api: Api) -> None:
    data = (await api.call("POST", "/sandbox", json={"command": {"exec": ["sh", "-c", "exit 7"], "mode": "oneshot"}}, expect=201))["data"]
    status = await api.data("GET", f"/sandbox/status/{data['sandboxId']}?waitForStatus=terminated&waitMs=10000")
    assert status["exitCode"] == 7


@pytest.mark.runs_on(*WIRE, *REAL)  # a real process killed at its timeout
async def test_execution_timeout_and_default_timeout(api: Api) -> None:
    sid = (await api.call("POST", "/sandbox", json={"timeout": {"execution": "200ms"}}, expect=201))["data"]["sandboxId"]
    ex = await api.data("POST", f"/sandbox/{sid}/execute", json={"command": ["sleep", "30"]})
    final = await api.wait_execution(ex["executionId"])
    assert final["status"] == "timeout" and final["exitCode"] == 124 and "timed out" in final["error"]
    ex = await api.data("POST", f"/sandbox/{sid}/execute", json={"command": ["sleep", "0.3"], "timeout": "5s"})
    assert (await api.wait_execution(ex["executionId"]))["status"] == "completed"


@pytest.mark.runs_on(*STORE)  # the service's waits over the store
async def test_long_poll_returns_current_state_when_wait_expires(api: Api) -> None:
    sid = (await api.call("POST", "/sandbox", json={}, expect=201))["data"]["sandboxId"]
    ex = await api.data("POST", f"/sandbox/{sid}/execute", json={"command": ["sleep", "5"]})
    still = await api.data("GET", f"/sandbox/execution/{ex['executionId']}?wait=100ms")
    assert still["status"] == "running" and "exitCode" not in still
    status = await api.data("GET", f"/sandbox/status/{sid}?waitForStatus=terminated&waitMs=50")
    assert status["status"] == "running"
    await api.call("DELETE", f"/sandbox/{sid}")
    final = await api.wait_execution(ex["executionId"])
    assert final["status"] == "cancelled"


@pytest.mark.runs_on(*STORE)  # the service caps output; both output stores
async def test_output_over_the_cap_is_truncated(make_api) -> None:  # type: ignore[no-untyped-def]
    api = await make_api(output_cap_bytes=1000)
    sid = (await api.call("POST", "/sandbox", json={}, expect=201))["data"]["sandboxId"]
    ex = await api.data("POST", f"/sandbox/{sid}/execute", json={"command": ["sh", "-c", "echo " + "y" * 5000]})
    final = await api.wait_execution(ex["executionId"])
    assert final["outputTruncated"] is True
    assert len(await api.stream(ex["stdoutStreamUrl"])) == 1000


@pytest.mark.runs_on(*STORE)  # the stores' queries
async def test_list_filters_and_pages(api: Api) -> None:
    ids = [(await api.call("POST", "/sandbox", json={"name": f"n{i}"}, expect=201))["data"]["sandboxId"] for i in range(3)]
    data = await api.data("GET", "/sandbox?limit=2")
    assert data["total"] == 3 and [s["sandboxId"] for s in data["sandboxes"]] == ids[::-1][:2]
    assert all(s["org"]["id"] for s in data["sandboxes"])
    assert (await api.data("GET", "/sandbox?name=n1"))["sandboxes"][0]["sandboxId"] == ids[1]
    for sort in ("name", "created", "updated", "status", "mode", "execution_count"):
        assert (await api.data("GET", f"/sandbox?sort={sort}&direction=asc"))["total"] == 3
    assert (await api.data("GET", "/sandbox?status=idle&direction=asc&offset=2"))["sandboxes"][0]["sandboxId"] == ids[2]
    await api.call("DELETE", f"/sandbox/{ids[0]}")
    assert (await api.data("GET", "/sandbox"))["total"] == 2
    assert [s["sandboxId"] for s in (await api.data("GET", "/sandbox?deletedOnly=true"))["sandboxes"]] == [ids[0]]


@pytest.mark.runs_on(*WIRE)  # refused while parsing, before the log
@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({"runtime": "cobol:1"}, 404, "runtime"),
        ({"runtimeId": "srt_nope"}, 404, "runtimeId"),
        ({"resources": {"memory": "lots"}}, 400, "resources.memory"),
        ({"resources": {"cpu": "fast"}}, 400, "resources.cpu"),
        ({"resources": {"memory": "1Mi"}}, 400, "resources.memory"),
        ({"resources": "big"}, 400, "resources"),
        ({"timeout": {"idle": "soon"}}, 400, "timeout.idle"),
        ({"network": {"port": 80}}, 400, "network.port"),
        ({"network": {"enabled": "yes"}}, 400, "network.enabled"),
        ({"env": {"A": 1}}, 400, "env.A"),
        ({"env": {"1BAD": "x"}}, 400, "env.1BAD"),
        ({"command": {"exec": "ls"}}, 400, "command.exec"),
        ({"command": {"exec": []}}, 400, "command.exec"),
        ({"command": {"mode": "oneshot"}}, 400, "command.exec"),
        ({"command": {"exec": ["ls"], "mode": "forever"}}, 400, "command.mode"),
        ({"files": [{"path": "a.txt", "content": "not base64!"}]}, 400, "files[0].content"),
        ({"files": [{"content": "YQ=="}]}, 400, "files[0].path"),
        ({"name": 5}, 400, "name"),
    ],
)
async def test_bad_create_input_names_the_field_and_creates_nothing(api: Api, body: dict, status: int, field: str) -> None:
    err = await api.call("POST", "/sandbox", json=body, expect=status)
    assert field in err["message"] and err["code"]
    assert (await api.data("GET", "/sandbox?live=true"))["total"] == 0
    engine = api.client.app[ENGINE]
    assert await engine.parts.log.last_position() == 0  # nothing half-made: not even an event


@pytest.mark.runs_on(*WIRE)  # refused while parsing
async def test_malformed_bodies(api: Api) -> None:
    resp = await api.client.post("/sandbox", data=b"{not json", headers={"Authorization": "Bearer test-key"})
    assert resp.status == 400 and "invalid JSON" in (await resp.json())["message"]
    resp = await api.client.post("/sandbox", json=[1, 2], headers={"Authorization": "Bearer test-key"})
    assert resp.status == 400
    sid = (await api.call("POST", "/sandbox", json={}, expect=201))["data"]["sandboxId"]
    err = await api.call("POST", f"/sandbox/{sid}/execute", json={}, expect=400)
    assert "command" in err["message"]
    err = await api.call("POST", f"/sandbox/{sid}/execute", json={"command": ["ls", 3]}, expect=400)
    assert "command[1]" in err["message"]
    err = await api.call("POST", f"/sandbox/{sid}/execute", json={"command": ["ls"], "timeout": "never"}, expect=400)
    assert "timeout" in err["message"]


@pytest.mark.runs_on(*WIRE)  # refused while reading the body
async def test_oversized_body_is_413(make_api) -> None:  # type: ignore[no-untyped-def]
    api = await make_api(max_body_bytes=1024)
    resp = await api.client.post("/sandbox", data=b"x" * 4096, headers={"Authorization": "Bearer test-key"})
    body = await resp.json()
    assert resp.status == 413 and body["code"] == "PAYLOAD_TOO_LARGE" and "body" in body["message"]


@pytest.mark.runs_on(*WIRE)  # both stores answer missing ids on every route in test_tenancy.py
@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "/sandbox/sbx_nope"), ("DELETE", "/sandbox/sbx_nope"), ("GET", "/sandbox/status/sbx_nope"),
     ("GET", "/sandbox/execution/exec_nope"), ("GET", "/sandbox/sandboxes/sbx_nope/executions"),
     ("GET", "/sandbox/sandboxes/sbx_nope/events"), ("GET", "/no/such/endpoint")],
)
async def test_unknown_ids_are_404(api: Api, method: str, path: str) -> None:
    err = await api.call(method, path, expect=404)
    assert err["code"].endswith("NOT_FOUND")


@pytest.mark.runs_on(*WIRE)  # refused while parsing
async def test_bad_query_parameters(api: Api) -> None:
    for q, field in [("limit=abc", "limit"), ("limit=1000", "limit"), ("status=sleepy", "status"), ("live=maybe", "live"),
                     ("direction=up", "direction")]:
        err = await api.call("GET", f"/sandbox?{q}", expect=400)
        assert field in err["message"]


@pytest.mark.runs_on(*WIRE)  # the stream id's MAC, before any store
async def test_unknown_stream_is_404_without_auth(api: Api) -> None:
    resp = await api.client.get("/streams/stm_" + "0" * 32)
    assert resp.status == 404
    for sneaky in ("..%2F..%2Fetc%2Fpasswd", "stm_..%2F..%2Fapi-key", "stm_%2Fetc%2Fpasswd"):
        resp = await api.client.get(yarl.URL(f"/streams/{sneaky}", encoded=True))
        assert resp.status == 404, sneaky


@pytest.mark.runs_on(*STORE)  # both output stores
async def test_a_stream_without_output_has_no_file_but_reads_empty(api: Api) -> None:
    """Streams store something at their first byte; one that never got a byte is still a
    stream (its id says so), readable and empty, during and after the run."""
    engine = api.client.app[ENGINE]
    data = (await api.call("POST", "/sandbox", json={"command": {"exec": ["sh", "-c", "sleep 0.3; echo late"],
                                                                 "mode": "oneshot"}}, expect=201))["data"]
    # Attached before the first byte: follows the stream until the command ends.
    out, err = await asyncio.gather(api.stream(data["stdoutStreamUrl"]), api.stream(data["stderrStreamUrl"]))
    assert (out, err) == (b"late\n", b"")
    await api.wait_execution(data["executionId"])
    stderr_id = yarl.URL(data["stderrStreamUrl"]).name
    stdout_id = yarl.URL(data["stdoutStreamUrl"]).name
    assert await engine.parts.outputs.size(stderr_id) == 0 and await engine.parts.outputs.size(stdout_id) == 5
    if isinstance(engine.parts.outputs, FileOutputStreams):  # the embedded profile: no file at all
        assert not (engine.parts.outputs.root / stderr_id).exists() and (engine.parts.outputs.root / stdout_id).exists()
    assert await api.stream(data["stderrStreamUrl"]) == b""
    assert engine.streams.issued(stderr_id) and engine.streams.issued(stdout_id)


@pytest.mark.runs_on(*WIRE)  # the stream id's MAC
async def test_a_forged_stream_id_is_404(api: Api) -> None:
    data = (await api.call("POST", "/sandbox", json={"command": {"exec": ["true"], "mode": "oneshot"}}, expect=201))["data"]
    real = yarl.URL(data["stderrStreamUrl"]).name
    assert (await api.client.get(f"/streams/{real}")).status == 200
    forged = [real[:-1] + ("0" if real[-1] != "0" else "1"),  # another MAC
              real.replace("e", "o", 1) if "e" in real[4:-32] else real[:-33] + "o" + real[-32:],  # other stream
              "stm_exec" + "0" * 26 + "e" + real[-32:]]  # another execution
    for sid in forged:
        assert sid != real
        assert (await api.client.get(f"/streams/{sid}")).status == 404, sid


@pytest.mark.runs_on(*STORE)  # the fake's scripted failure, recorded in both stores
async def test_provision_failure_is_recorded_not_half_made(make_api) -> None:  # type: ignore[no-untyped-def]
    api = await make_api(driver="fake")  # the failure is scripted
    engine = api.client.app[ENGINE]
    engine.parts.driver.fail_provision = "disk full"  # type: ignore[attr-defined]
    err = await api.call("POST", "/sandbox", json={}, expect=502)
    assert "disk full" in err["message"]
    (sb,), total = await engine.parts.store.list_sandboxes(__import__("hutch.projections.base").projections.base.SandboxQuery(include_deleted=True))
    assert total == 1 and sb.status.value == "failed" and "disk full" in sb.reason
    assert engine.parts.driver.sandboxes == {}  # type: ignore[attr-defined]


@pytest.mark.runs_on(*STORE)  # counts and positions from both stores
async def test_metrics_in_prometheus_text(api: Api) -> None:
    sid = (await api.call("POST", "/sandbox", json={}, expect=201))["data"]["sandboxId"]
    await api.call("POST", "/sandbox", json={}, expect=201)
    await api.call("DELETE", f"/sandbox/{sid}")
    resp = await api.client.get("/metrics", headers=AUTH)
    text = await resp.text()
    assert resp.status == 200 and resp.content_type == "text/plain", text
    lines = text.splitlines()
    assert 'hutch_sandboxes{status="idle"} 1' in lines and 'hutch_sandboxes{status="deleted"} 1' in lines
    assert "# TYPE hutch_sandboxes gauge" in lines and text.count("# TYPE hutch_sandboxes ") == 1
    position = next(int(x.split()[1]) for x in lines if x.startswith("hutch_event_log_position "))
    assert position >= 5 and f"hutch_projection_position {position}" in lines  # read-your-writes
    assert any(x.startswith("hutch_driver_info{driver=") for x in lines)
    assert (await api.client.get("/metrics")).status == 401  # behind the key like the rest


def _counted(text: str, name: str, **labels: str) -> int:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    total = 0
    for line in text.splitlines():
        named = line.startswith((f"{name}{{", f"{name} "))
        if named and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += int(line.rsplit(" ", 1)[1])
    return total


@pytest.mark.runs_on(*STORE)  # the service's counters on both logs and stores
async def test_metrics_count_the_log_path_work(api: Api, profile: dict[str, str]) -> None:
    # Counts are process-wide: read the change one create makes, never the absolute value.
    before = await (await api.client.get("/metrics", headers=AUTH)).text()
    await api.call("POST", "/sandbox", json={}, expect=201)
    after = await (await api.client.get("/metrics", headers=AUTH)).text()

    def delta(name: str, **labels: str) -> int:
        return _counted(after, name, **labels) - _counted(before, name, **labels)

    assert "# TYPE hutch_eventlog_appends_total counter" in after.splitlines()
    appends, events = delta("hutch_eventlog_appends_total"), delta("hutch_eventlog_append_events_total")
    assert appends >= 1 and events >= appends, after
    assert 1 <= delta("hutch_eventlog_writes_total") <= appends
    assert delta("hutch_eventlog_write_events_total") == events
    assert delta("hutch_projector_events_total") == events  # each applied once, none skipped
    assert delta("hutch_projector_batches_total") >= 1
    statements = delta("hutch_store_statements_total", store="projection store")
    assert (statements > 0) == bool(profile), after  # PostgreSQL only in the production profile
