"""The node driver's placement seen through the API: a sandbox no node has room for is
refused with 503 NO_CAPACITY naming every node, before anything is recorded; one no node could
hold even empty with a 400 naming resources.memory."""

from __future__ import annotations

import asyncio
import re

import pytest

from hutch.drivers.local.admission import host_memory
from tests.api.conftest import AUTH, NODE, Api


@pytest.mark.runs_on(*NODE)  # placement happens in the node driver only
async def test_a_sandbox_that_fits_nowhere_answers_503_and_records_nothing(api: Api) -> None:
    before = await api.data("GET", "/sandbox")
    # The whole memory of the nodes' host: an empty node could hold it, never with its
    # MemAvailable now (always below MemTotal), so a full cluster: 503.
    whole = {"runtime": "base:latest", "resources": {"memory": f"{host_memory()[0] >> 10}Ki"}}
    body = await api.call("POST", "/sandbox", json=whole, expect=503)
    assert body["code"] == "NO_CAPACITY", body
    assert re.fullmatch(r"no node can take a sandbox of [0-9.]+Gi memory and 1000m cpu: "
                        r"n1 has [0-9.]+[GM]i memory free; n2 has [0-9.]+[GM]i memory free", body["message"]), body
    # Larger than any node could hold even empty (a typo): a 400 naming the field, which the
    # clients do not retry for ~30 s as they do a 503.
    body = await api.call("POST", "/sandbox", json={"runtime": "base:latest", "resources": {"memory": "4096Gi"}},
                          expect=400)
    assert body["code"] == "INVALID_INPUT" and re.fullmatch(
        r"resources\.memory: 4096Gi is more than any sandbox can have on any node \(at most [0-9.]+Gi\)",
        body["message"]), body
    assert await api.data("GET", "/sandbox") == before
    # One that fits is placed and runs.
    created = await api.data("POST", "/sandbox", json={"runtime": "base:latest"}, expect=201)
    ex = await api.data("POST", f"/sandbox/{created['sandboxId']}/execute", json={"command": ["true"]})
    assert (await api.wait_execution(ex["executionId"]))["exitCode"] == 0


@pytest.mark.runs_on(*NODE)  # the node driver's own gauges
async def test_metrics_show_each_node(api: Api) -> None:
    await api.data("POST", "/sandbox", json={"runtime": "base:latest", "resources": {"memory": "300Mi"}}, expect=201)
    for _ in range(30):  # the nodes are read every second
        text = await (await api.client.get("/metrics", headers=AUTH)).text()
        committed = re.findall(r'^hutch_node_memory_committed_bytes\{node="(n[12])"\} (\S+)$', text, re.M)
        if sum(float(v) for _, v in committed) >= 300 << 20:
            break
        await asyncio.sleep(0.2)
    else:
        raise AssertionError(text)
    assert re.search(r'^hutch_node_up\{node="n1"\} 1', text, re.M) and re.search(r'^hutch_node_up\{node="n2"\} 1', text, re.M)
    assert sorted(n for n, _ in committed) == ["n1", "n2"]
    assert sum(float(v) for v in re.findall(r'^hutch_node_sandboxes\{node="n[12]"\} (\S+)$', text, re.M)) == 1


@pytest.mark.runs_on(*NODE)  # the catalog's sizes come from the nodes
async def test_the_runtime_list_shows_what_the_nodes_built(api: Api) -> None:
    listed = {r["name"]: r for r in (await api.data("GET", "/sandbox/runtimes?limit=100"))["runtimes"]}
    base = listed["base:latest"]
    assert base["available"] is True and base["sizeBytes"] > 10 * 2**20 and base["builtAt"].endswith("Z"), base


@pytest.mark.runs_on(*NODE)  # placement happens in the node driver only
async def test_creates_in_a_row_are_spread(api: Api) -> None:
    for _ in range(4):
        await api.data("POST", "/sandbox", json={"runtime": "base:latest"}, expect=201)
    text = await (await api.client.get("/metrics", headers=AUTH)).text()
    counts = sorted(float(v) for v in re.findall(r'^hutch_node_sandboxes\{node="n[12]"\} (\S+)$', text, re.M))
    assert counts == [2.0, 2.0], text


@pytest.mark.runs_on(*NODE)  # placement happens in the node driver only
async def test_a_destroy_frees_its_room_at_once(api: Api) -> None:
    """What a destroy frees is free for the next create at once, as a create's room is taken at
    once: one-shots at concurrency 16 on the cluster were refused NO_CAPACITY while the nodes'
    copies still counted sandboxes already gone."""
    made = [(await api.data("POST", "/sandbox", json={"runtime": "base:latest"}, expect=201))["sandboxId"]
            for _ in range(4)]
    for sid in made:
        await api.call("DELETE", f"/sandbox/{sid}")
    text = await (await api.client.get("/metrics", headers=AUTH)).text()
    counts = [float(v) for v in re.findall(r'^hutch_node_sandboxes\{node="n[12]"\} (\S+)$', text, re.M)]
    committed = [float(v) for v in re.findall(r'^hutch_node_cpu_committed_millis\{node="n[12]"\} (\S+)$', text, re.M)]
    assert len(counts) == 2 and sum(counts) == 0 and sum(committed) == 0, text
