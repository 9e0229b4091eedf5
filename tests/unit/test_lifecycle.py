from __future__ import annotations

from collections.abc import Sequence
from functools import reduce

import pytest

from hutch.core.errors import IllegalTransition, InvalidInput, SandboxNotFound
from hutch.core.events import Event, EventData, SandboxCreated
from hutch.core.lifecycle import (
    Command,
    Create,
    Destroy,
    Fail,
    FinishExecution,
    Start,
    StartExecution,
    Terminate,
    decide,
    evolve_sandbox,
)
from hutch.core.models import ExecutionStatus, Mode, Sandbox, SandboxSpec, SandboxStatus


def fold(sb: Sandbox | None, payloads: Sequence[EventData]) -> Sandbox:
    events = [Event(f"evt_{i}", "sbx_1", f"2026-01-01T00:00:{i:02d}.000Z", p) for i, p in enumerate(payloads)]
    out = reduce(evolve_sandbox, events, sb)
    assert out is not None
    return out


def new(mode: Mode = Mode.INTERACTIVE) -> Sandbox:
    return fold(None, decide(None, Create(spec=SandboxSpec(runtime="base:latest", runtime_id="srt", mode=mode))))


def step(sb: Sandbox, command: Command) -> Sandbox:
    return fold(sb, decide(sb, command))


def test_interactive_lifecycle() -> None:
    sb = step(new(), Start())
    assert sb.status is SandboxStatus.IDLE
    sb = step(sb, StartExecution("exec_1", ("ls",)))
    sb = step(sb, StartExecution("exec_2", ("ls",)))
    assert sb.status is SandboxStatus.RUNNING and sb.running == {"exec_1", "exec_2"}
    sb = step(sb, FinishExecution("exec_1", ExecutionStatus.COMPLETED, exit_code=0))
    assert sb.status is SandboxStatus.RUNNING
    sb = step(sb, FinishExecution("exec_2", ExecutionStatus.COMPLETED, exit_code=2))
    assert sb.status is SandboxStatus.IDLE and sb.executions == 2
    sb = step(sb, Destroy())
    assert sb.status is SandboxStatus.STOPPING
    sb = step(sb, Terminate(reason="destroyed on request", deleted=True))
    assert sb.status is SandboxStatus.DELETED


def test_oneshot_completes_with_the_exit_code_then_terminates() -> None:
    sb = step(step(new(Mode.ONESHOT), Start()), StartExecution("exec_1", ("false",)))
    sb = step(sb, FinishExecution("exec_1", ExecutionStatus.COMPLETED, exit_code=1))
    events = decide(sb, Terminate(reason="done", exit_code=1))
    assert [e.type for e in events] == ["lifecycle:completed", "lifecycle:terminated"]
    sb = fold(sb, events)
    assert sb.status is SandboxStatus.TERMINATED and sb.exit_code == 1
    with pytest.raises(IllegalTransition):
        decide(step(step(new(Mode.ONESHOT), Start()), StartExecution("exec_1", ("a",))), StartExecution("exec_2", ("b",)))


@pytest.mark.parametrize(
    ("setup", "command"),
    [
        ([Fail("boom")], StartExecution("exec_1", ("ls",))),
        ([Start(), Terminate(reason="x")], StartExecution("exec_1", ("ls",))),
        ([Start()], Start()),
        ([Start()], FinishExecution("exec_9", ExecutionStatus.COMPLETED)),
        ([], StartExecution("exec_1", ("ls",))),  # still creating
    ],
)
def test_illegal_transitions_raise_and_change_nothing(setup: list[Command], command: Command) -> None:
    sb = new()
    for c in setup:
        sb = step(sb, c)
    with pytest.raises(IllegalTransition) as info:
        decide(sb, command)
    assert sb.sandbox_id in info.value.message and info.value.status == 409


def test_a_create_is_decided_like_every_other_sandbox_event() -> None:
    spec = SandboxSpec(runtime="base:latest", runtime_id="srt")
    assert decide(None, Create(spec=spec, api_key_id="key_1", initial_execution_id="exec_1",
                               initial_command=("ls",))) == [
        SandboxCreated(spec=spec, api_key_id="key_1", initial_execution_id="exec_1", initial_command=("ls",))]
    for setup in ([], [Start()], [Fail("boom")], [Start(), Destroy(), Terminate(reason="x", deleted=True)]):
        sb = new()
        for c in setup:
            sb = step(sb, c)
        with pytest.raises(IllegalTransition) as info:  # an id is used once, whatever became of it
            decide(sb, Create(spec=spec))
        assert sb.sandbox_id in info.value.message and info.value.status == 409
    with pytest.raises(InvalidInput):  # a queued command is read back under its execution id
        decide(None, Create(spec=spec, initial_command=("ls",)))
    with pytest.raises(SandboxNotFound):  # nothing else is decided before the create
        decide(None, Start())


def test_destroy_and_fail_are_idempotent() -> None:
    sb = step(step(step(new(), Start()), Destroy()), Terminate(reason="x", deleted=True))
    assert decide(sb, Destroy()) == []
    assert decide(sb, Fail("late")) == []
    assert decide(sb, Terminate(reason="again")) == []


def test_pause_and_resume() -> None:
    from hutch.core.lifecycle import Pause, Resume

    sb = step(step(new(), Start()), Pause(terminates_at="2026-01-02T00:00:00.000Z"))
    assert sb.status is SandboxStatus.PAUSED and sb.terminates_at == "2026-01-02T00:00:00.000Z"
    assert decide(sb, Pause()) == []  # idempotent
    with pytest.raises(IllegalTransition, match="paused; resume it first"):
        decide(sb, StartExecution("exec_1", ("ls",)))
    sb = step(sb, Resume(auto=True))
    assert sb.status is SandboxStatus.IDLE and sb.paused_at is None and sb.terminates_at is None
    assert decide(sb, Resume()) == []
    busy = step(sb, StartExecution("exec_1", ("ls",)))
    with pytest.raises(IllegalTransition, match="running executions"):
        decide(busy, Pause())
    with pytest.raises(IllegalTransition):
        decide(step(sb, Terminate(reason="x")), Resume())
