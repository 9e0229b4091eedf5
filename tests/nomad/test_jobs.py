"""The nomad job a sandbox runs as (drivers/nomad/jobs.py), without Nomad: what every task
config carries of its limits and egress policy, and bad settings refused by name."""

from __future__ import annotations

import pytest

from hutch.core.egress import denied_ranges
from hutch.core.errors import InvalidInput
from hutch.drivers.base import ResourceLimits
from hutch.drivers.nomad.jobs import default_resources, egress_denied, job_spec, sized


def task_of(job: dict) -> dict:  # type: ignore[type-arg]
    return job["Job"]["TaskGroups"][0]["Tasks"][0]  # type: ignore[no-any-return]


def test_a_sandbox_that_asks_for_nothing_gets_the_services_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HUTCH_DEFAULT_MEMORY", "HUTCH_DEFAULT_CPU", "HUTCH_SANDBOX_EGRESS_PERMIT", "HUTCH_SANDBOX_EGRESS_DENY"):
        monkeypatch.delenv(name, raising=False)
    task = task_of(job_spec("j", "img", ["*"], ResourceLimits(), {}))
    assert task["Resources"]["MemoryMB"] == 512 and task["Config"]["cpu_millis"] == 1000
    assert sized(ResourceLimits(memory_bytes=512 * 2**20, cpu_millis=1000)) == sized(ResourceLimits())  # a pool entry's size
    monkeypatch.setenv("HUTCH_DEFAULT_MEMORY", "1Gi")
    monkeypatch.setenv("HUTCH_DEFAULT_CPU", "0.5")
    task = task_of(job_spec("j", "img", ["*"], ResourceLimits(), {}))
    assert task["Resources"]["MemoryMB"] == 1024 and task["Config"]["cpu_millis"] == 500
    # A sandbox with a network carries the denied ranges, the server's own list.
    task = task_of(job_spec("j", "img", ["*"], ResourceLimits(), {}, network=True, denied=egress_denied()))
    assert task["Config"]["denied"] == denied_ranges() and "10.0.0.0/8" in task["Config"]["denied"]
    monkeypatch.setenv("HUTCH_SANDBOX_EGRESS_PERMIT", "10.1.0.0/16")
    assert "10.1.0.0/16" not in egress_denied() and "10.0.0.0/16" in egress_denied()


@pytest.mark.parametrize(("name", "value"), [
    ("HUTCH_DEFAULT_MEMORY", "lots"), ("HUTCH_DEFAULT_CPU", "-1"),
    ("HUTCH_SANDBOX_EGRESS_PERMIT", "8.8.8.0/24"), ("HUTCH_SANDBOX_EGRESS_DENY", "nonsense")])
def test_bad_settings_are_refused_by_name(monkeypatch: pytest.MonkeyPatch, name: str, value: str) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(InvalidInput) as err:
        default_resources() if name.startswith("HUTCH_DEFAULT") else egress_denied()
    assert name in err.value.message and err.value.field == name, err.value
