"""A create's owner row (core/replicas.py: which replica drives the sandbox) and the driver's
provision: beside each other where no other replica's driver can reach the sandbox (the local
driver's own host, the fake driver), one after the other where one can (the node and nomad
drivers: a starting replica's recovery or a survivor's take-over finds it by its owner row).
A failed owner row leaves nothing made."""

from __future__ import annotations

import asyncio

import pytest

from hutch.api.keys import ENGINE
from hutch.core.errors import ReplicaUnavailable
from hutch.core.replicas import Tenant
from hutch.drivers.base import ProvisionRequest
from hutch.drivers.local.driver import LocalDriver
from hutch.drivers.node.driver import NodeDriver
from hutch.drivers.nomad.driver import NomadDriver
from hutch.drivers.roles import Adoption
from tests.api.conftest import Api

ONESHOT = {"command": {"exec": ["echo", "hi"], "mode": "oneshot"}}


def watch(engine: object, monkeypatch: pytest.MonkeyPatch, seen: list[str], *, own_fails: bool = False) -> None:
    replicas, lifecycle = engine.replicas, engine.provisioning._lifecycle  # type: ignore[attr-defined]
    own, provision = replicas.own, lifecycle.provision

    async def slow_own(sandbox_id: str, tenant: Tenant | None = None) -> None:
        seen.append("own")
        await asyncio.sleep(0.2)  # a slow commit
        if own_fails:
            raise ReplicaUnavailable("the replica registry is away (test)")
        await own(sandbox_id, tenant)
        seen.append("owned")

    async def watched(req: ProvisionRequest) -> None:
        seen.append("provision")
        await provision(req)
        seen.append("made")

    monkeypatch.setattr(replicas, "own", slow_own)
    monkeypatch.setattr(lifecycle, "provision", watched)


@pytest.mark.runs_on("fake-production")
async def test_the_sandbox_is_made_while_the_owner_row_commits(
        api: Api, profile: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    engine = api.client.server.app[ENGINE]
    seen: list[str] = []
    watch(engine, monkeypatch, seen)
    created = await api.data("POST", "/sandbox", json=ONESHOT, expect=201)
    assert seen.index("made") < seen.index("owned"), seen  # one round trip fewer in series
    assert await api.stream(created["stdoutStreamUrl"]) == b"hi\n"
    assert (await api.wait_execution(created["executionId"]))["status"] == "completed"


@pytest.mark.runs_on("fake-production")
async def test_where_other_replicas_reach_it_the_owner_row_commits_first(
        api: Api, profile: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    engine = api.client.server.app[ENGINE]
    monkeypatch.setattr(engine.provisioning, "_reachable_elsewhere", True)
    seen: list[str] = []
    watch(engine, monkeypatch, seen)
    created = await api.data("POST", "/sandbox", json=ONESHOT, expect=201)
    assert seen.index("owned") < seen.index("provision"), seen
    assert (await api.wait_execution(created["executionId"]))["status"] == "completed"


def test_which_drivers_other_replicas_reach() -> None:
    # What ``_reachable_elsewhere`` reads: a driver another replica can take a sandbox over with.
    assert issubclass(NodeDriver, Adoption) and issubclass(NomadDriver, Adoption)
    assert not issubclass(LocalDriver, Adoption)


@pytest.mark.runs_on("fake-production")
async def test_a_failed_owner_row_leaves_nothing_made(
        api: Api, profile: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    engine = api.client.server.app[ENGINE]
    seen: list[str] = []
    watch(engine, monkeypatch, seen, own_fails=True)
    before = await engine.provisioning._lifecycle.alive()
    body = await api.call("POST", "/sandbox", json=ONESHOT, expect=503)
    assert "replica registry is away" in str(body), body
    assert "made" in seen, seen  # it was made meanwhile, and then
    assert await engine.provisioning._lifecycle.alive() == before  # destroyed
    listed = await api.data("GET", "/sandbox")
    assert not listed.get("sandboxes"), listed  # and never recorded
