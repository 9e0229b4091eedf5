"""How the nomad driver says why a sandbox's allocation ended (placement.alloc_reason), from
allocations shaped as the dev agent answers them (read while a job was stopped outside hutch)."""

from __future__ import annotations

from hutch.drivers.nomad.placement import alloc_reason

EVENTS = [{"Type": "Received", "DisplayMessage": "Task received by client"},
          {"Type": "Task Setup", "DisplayMessage": "Building Task Directory"},
          {"Type": "Started", "DisplayMessage": "Task started by client"},
          {"Type": "Killing", "DisplayMessage": "Sent interrupt. Waiting 2s before force killing"}]


def stopping(client_status: str, desired: str = "stop") -> dict:  # type: ignore[type-arg]
    return {"ClientStatus": client_status, "ClientDescription": "Tasks are running", "DesiredStatus": desired,
            "DesiredDescription": "alloc not needed due to job update", "NodeName": "vm",
            "TaskStates": {"sandbox": {"State": "running", "Events": EVENTS}}}


def test_an_allocation_nomad_is_stopping_is_said_to_be_stopped() -> None:
    """Its task still runs as Nomad stops it (a job stopped outside hutch, a drain): it was
    reported "allocation running; … Task started by client", as if nothing were wrong."""
    for client_status in ("running", "pending"):
        said = alloc_reason(stopping(client_status))
        assert said == "allocation being stopped by Nomad (alloc not needed due to job update); on node vm", said
    said = alloc_reason(stopping("running", desired="evict"))
    assert said.startswith("allocation being evicted by Nomad (alloc not needed due to job update)"), said


def test_an_allocation_that_ended_keeps_its_tasks_words() -> None:
    ended = {**stopping("failed"), "ClientDescription": "Failed tasks",
             "TaskStates": {"sandbox": {"Events": [{"Type": "Terminated", "DisplayMessage": "Exit Code: 137",
                                                    "Details": {"oom_killed": "true"}}]}}}
    assert alloc_reason(ended) == "allocation failed; on node vm; Failed tasks; OOM killed"
