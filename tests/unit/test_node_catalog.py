"""The node agents' directory's reading of Nomad's answers (hutch/drivers/node/catalog.py
``join``), on answers recorded from the one-box cluster (data/nomad_catalog.json) and on
copies of them changed the way Nomad changes them: a node down, marked ineligible, drained;
an allocation replaced while the old one still stops. The live following is
tests/cluster/test_node_catalog.py's."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from hutch.core.errors import InvalidInput
from hutch.drivers.node.catalog import (
    AgentNode,
    NodeDrain,
    NomadAgentDirectory,
    drains,
    host_port,
    join,
)

RECORDED = json.loads((Path(__file__).parent / "data" / "nomad_catalog.json").read_text())
SERVICE: list[dict[str, Any]] = RECORDED["service"]
NODES: list[dict[str, Any]] = RECORDED["nodes"]


def addresses() -> dict[str, str]:
    names = {n["ID"]: n["Name"] for n in NODES}
    return {names[r["NodeID"]]: f"{r['Address']}:{r['Port']}" for r in SERVICE}


def changed(name: str, **fields: Any) -> list[dict[str, Any]]:
    nodes = copy.deepcopy(NODES)
    for node in nodes:
        if node["Name"] == name:
            node.update(fields)
    return nodes


def test_the_recorded_answers_give_one_placeable_agent_per_client() -> None:
    view = join(SERVICE, NODES)
    assert {name: a.address for name, a in view.items()} == addresses()
    assert set(view) == {"hutch-c1", "hutch-c2", "hutch-c3"}
    assert all(a.placeable and a.reachable for a in view.values())
    c1 = next(n for n in NODES if n["Name"] == "hutch-c1")
    assert view["hutch-c1"] == AgentNode(name="hutch-c1", node_id=c1["ID"], address=addresses()["hutch-c1"],
                                         status="ready", eligible=True, draining=False)


@pytest.mark.parametrize(("fields", "placeable", "reachable"), [
    ({"Status": "down"}, False, False),
    ({"Status": "disconnected"}, False, False),
    ({"Status": "initializing"}, False, False),
    ({"SchedulingEligibility": "ineligible"}, False, True),
    # what `nomad node drain -enable` sets: both
    ({"SchedulingEligibility": "ineligible", "Drain": True}, False, True),
])
def test_a_node_that_may_not_take_sandboxes_is_not_placeable(fields: dict[str, Any], placeable: bool,
                                                            reachable: bool) -> None:
    view = join(SERVICE, changed("hutch-c2", **fields))
    c2 = view["hutch-c2"]
    assert (c2.placeable, c2.reachable) == (placeable, reachable), c2
    assert c2.draining == bool(fields.get("Drain"))
    assert view["hutch-c1"].placeable and view["hutch-c3"].placeable


def _last(status: str, started: str = "2026-11-29T12:40:01.5Z") -> dict[str, Any]:
    """LastDrain as Nomad keeps it (DrainMetadata)."""
    return {"StartedAt": started, "UpdatedAt": started, "Status": status, "AccessorID": "", "Meta": None}


@pytest.mark.parametrize(("fields", "drain"), [
    ({}, None),  # never drained: LastDrain null, as recorded
    ({"Drain": True, "SchedulingEligibility": "ineligible", "LastDrain": _last("draining")},
     NodeDrain("2026-11-29T12:40:01.5Z", active=True)),
    # done: at once with -ignore-system on a node that runs only system jobs; it stays ineligible
    ({"SchedulingEligibility": "ineligible", "LastDrain": _last("complete")},
     NodeDrain("2026-11-29T12:40:01.5Z", active=False)),
    ({"LastDrain": _last("canceled")}, None),  # -disable before it completed
    ({"Drain": True}, NodeDrain("draining", active=True)),  # a Nomad that keeps no LastDrain
])
def test_a_drain_nomad_was_asked_for_is_told_by_the_node_list_alone(fields: dict[str, Any],
                                                                   drain: NodeDrain | None) -> None:
    told = drains(changed("hutch-c2", **fields))
    assert told == ({"hutch-c2": drain} if drain else {}), told


def test_one_registration_per_node_the_newest() -> None:
    c1 = next(r for r in SERVICE if r["Address"] == "10.77.0.11")
    old = {**c1, "AllocID": "old", "ID": "old", "Port": 1111, "CreateIndex": c1["CreateIndex"] - 5}
    new = {**c1, "AllocID": "new", "ID": "new", "Port": 2222, "CreateIndex": c1["CreateIndex"] + 5}
    for order in ([old, *SERVICE, new], [new, *SERVICE, old]):
        view = join(order, NODES)
        assert len(view) == 3
        assert view["hutch-c1"].address == "10.77.0.11:2222"


def test_a_registration_of_a_node_not_listed_yet_or_without_an_address_is_left_out() -> None:
    stranger = {**SERVICE[0], "NodeID": "00000000-0000-0000-0000-000000000000", "ID": "x"}
    assert set(join([*SERVICE, stranger], NODES)) == {"hutch-c1", "hutch-c2", "hutch-c3"}
    assert set(join(SERVICE, [n for n in NODES if n["Name"] != "hutch-c3"])) == {"hutch-c1", "hutch-c2"}
    no_port = [{**r, "Port": 0} if r["Address"] == "10.77.0.12" else r for r in SERVICE]
    assert set(join(no_port, NODES)) == {"hutch-c1", "hutch-c3"}
    assert join([], NODES) == {}
    assert join(SERVICE, []) == {}


def test_addresses() -> None:
    assert host_port("10.77.0.11", 4750) == "10.77.0.11:4750"
    assert host_port("fd00::11", 4750) == "[fd00::11]:4750"
    assert host_port("node-1.internal", 4750) == "node-1.internal:4750"


@pytest.mark.parametrize(("kw", "field"), [({"service": ""}, "HUTCH_NODE_SERVICE"),
                                           ({"namespace": ""}, "HUTCH_NODE_NAMESPACE")])
def test_an_empty_service_or_namespace_is_refused_naming_it(kw: dict[str, str], field: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        NomadAgentDirectory("http://127.0.0.1:4646", None, **kw)
    assert caught.value.field == field and field in str(caught.value)
