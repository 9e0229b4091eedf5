from __future__ import annotations

from collections.abc import Sequence
from functools import reduce

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hutch.core.errors import IllegalTransition, InvalidInput, SandboxNotFound
from hutch.core.events import Event, EventData, SandboxCreated
from hutch.core.lifecycle import (
    ChangeTimeout,
    Command,
    Create,
    Destroy,
    Discard,
    Fail,
    FinishExecution,
    Move,
    Pause,
    Resume,
    Start,
    StartExecution,
    TakeCheckpoint,
    Terminate,
    decide,
    decide_in_turn,
    evolve_sandbox,
)
from hutch.core.models import (
    ExecutionStatus,
    Mode,
    SandboxSpec,
    SandboxState,
    SandboxStatus,
    TimeoutSpec,
)


def fold(sb: SandboxState | None, payloads: Sequence[EventData]) -> SandboxState:
    events = [Event(f"evt_{i}", "sbx_1", f"2026-01-01T00:00:{i:02d}.000Z", p) for i, p in enumerate(payloads)]
    out = reduce(evolve_sandbox, events, sb)
    assert out is not None
    return out


def new(mode: Mode = Mode.INTERACTIVE) -> SandboxState:
    return fold(None, decide(None, Create(spec=SandboxSpec(runtime="base:latest", runtime_id="srt", mode=mode))))


def step(sb: SandboxState, command: Command) -> SandboxState:
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


def test_the_node_is_recorded_at_start_and_a_move_changes_it_only_when_idle() -> None:
    sb = step(new(), Start(node="n1"))
    assert sb.node == "n1"
    moved = step(sb, Move(from_node="n1", to_node="n2", reason="its node was drained"))
    assert (moved.node, moved.status) == ("n2", SandboxStatus.IDLE)
    with pytest.raises(IllegalTransition, match="it runs on n1"):
        decide(sb, Move(from_node="n3", to_node="n2", reason="r"))  # not where the log says it is
    with pytest.raises(IllegalTransition, match="only an idle sandbox moves"):
        decide(step(sb, StartExecution("exec_1", ("sleep", "9"))), Move(from_node="n1", to_node="n2", reason="r"))
    with pytest.raises(IllegalTransition, match="checkpoints are kept on n1"):
        decide(step(sb, TakeCheckpoint("ckpt_1", "cp")), Move(from_node="n1", to_node="n2", reason="r"))


def test_oneshot_completes_with_the_exit_code_then_terminates() -> None:
    sb = step(step(new(Mode.ONESHOT), Start()), StartExecution("exec_1", ("false",)))
    sb = step(sb, FinishExecution("exec_1", ExecutionStatus.COMPLETED, exit_code=1))
    events = decide(sb, Terminate(reason="done", exit_code=1))
    assert [e.type for e in events] == ["lifecycle:completed", "lifecycle:terminated"]
    sb = fold(sb, events)
    assert sb.status is SandboxStatus.TERMINATED and sb.exit_code == 1
    with pytest.raises(IllegalTransition):
        decide(step(step(new(Mode.ONESHOT), Start()), StartExecution("exec_1", ("a",))), StartExecution("exec_2", ("b",)))


def test_commands_decided_in_turn_see_what_the_ones_before_them_said() -> None:
    """A create's Start and its command's StartExecution, decided for one append: the second
    against the sandbox the first leaves (idle), and a refusal anywhere refuses them all."""
    sb = new(Mode.ONESHOT)
    events = decide_in_turn(sb, [Start(), StartExecution("exec_1", ("true",))])
    assert [e.type for e in events] == ["lifecycle:started", "execution:started"]
    after = fold(sb, events)
    assert after.status is SandboxStatus.RUNNING and after.running == {"exec_1"} and after.executions == 1
    with pytest.raises(IllegalTransition, match="execute in a oneshot sandbox"):  # the second is refused
        decide_in_turn(sb, [Start(), StartExecution("exec_1", ("a",)), StartExecution("exec_2", ("b",))])
    with pytest.raises(IllegalTransition, match="cannot start"):  # the first is refused
        decide_in_turn(step(sb, Start()), [Start(), StartExecution("exec_1", ("a",))])
    assert decide_in_turn(sb, []) == []


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
    with pytest.raises(IllegalTransition):
        decide(step(sb, Terminate(reason="x")), Resume())


def test_a_sandbox_pauses_with_its_commands_frozen_and_resumes_them_running() -> None:
    """E2B's pause: the running commands are frozen with the sandbox and still ``running``;
    one that ends meanwhile (cancelled) leaves it paused; the resume makes it running again
    while any is left, idle once none is; a destroy ends them all."""
    from hutch.core.lifecycle import evolve_execution

    busy = step(step(step(new(), Start()), StartExecution("exec_1", ("sleep", "60"))),
                StartExecution("exec_2", ("sleep", "60")))
    paused = step(busy, Pause())
    assert paused.status is SandboxStatus.PAUSED and paused.running == {"exec_1", "exec_2"}
    assert decide(paused, Pause()) == []
    one_left = step(paused, FinishExecution("exec_1", ExecutionStatus.CANCELLED, exit_code=137))
    assert one_left.status is SandboxStatus.PAUSED and one_left.running == {"exec_2"}
    resumed = step(one_left, Resume())
    assert resumed.status is SandboxStatus.RUNNING and resumed.paused_at is None
    idle = step(resumed, FinishExecution("exec_2", ExecutionStatus.COMPLETED, exit_code=0))
    assert idle.status is SandboxStatus.IDLE
    # Ended while paused, its commands with it: cancelled, none left running.
    ended = step(step(paused, Destroy()), Terminate(reason="destroyed on request", deleted=True))
    assert ended.status is SandboxStatus.DELETED and not ended.running
    [started] = decide(busy, StartExecution("exec_3", ("true",)))
    ex = evolve_execution(None, Event("e1", busy.sandbox_id, "2026-01-01T00:00:00.000Z", started))
    [*_, terminated] = decide(step(paused, Destroy()), Terminate(reason="destroyed on request", deleted=True))
    gone = evolve_execution(ex, Event("e2", busy.sandbox_id, "2026-01-01T00:00:01.000Z", terminated))
    assert gone is not None and gone.status is ExecutionStatus.CANCELLED


def test_a_filesystem_only_pause_ends_its_commands_as_a_stop_does_and_records_its_mode() -> None:
    """``Pause(mode="filesystem")``: the event says so (a restarted server finds nothing to thaw),
    the running commands end cancelled, saying why, none is left running; the driver's later
    report of the kill is refused (the command is over); the resume makes it idle."""
    from hutch.core.events import PAUSE_FILESYSTEM
    from hutch.core.lifecycle import PAUSED_FILESYSTEM_ENDED, Pause, Resume, evolve_execution

    busy = step(step(new(), Start()), StartExecution("exec_1", ("sleep", "60")))
    [started] = decide(step(new(), Start()), StartExecution("exec_1", ("sleep", "60")))
    ex = evolve_execution(None, Event("e1", busy.sandbox_id, "2026-01-01T00:00:00.000Z", started))
    paused_event, finished = decide(busy, Pause(mode=PAUSE_FILESYSTEM))  # each command's end, recorded
    assert paused_event.mode == PAUSE_FILESYSTEM
    paused = step(busy, Pause(mode=PAUSE_FILESYSTEM))
    assert paused.status is SandboxStatus.PAUSED and paused.paused_mode == PAUSE_FILESYSTEM and not paused.running
    for at, data in (("01", paused_event), ("01", finished)):
        ex = evolve_execution(ex, Event("e2", busy.sandbox_id, f"2026-01-01T00:00:{at}.000Z", data))
    assert ex is not None and ex.status is ExecutionStatus.CANCELLED and ex.error == PAUSED_FILESYSTEM_ENDED
    assert finished.status is ExecutionStatus.CANCELLED and finished.error == PAUSED_FILESYSTEM_ENDED
    with pytest.raises(IllegalTransition, match="not running"):
        decide(paused, FinishExecution("exec_1", ExecutionStatus.CANCELLED, exit_code=137))
    assert decide(paused, Pause()) == []  # paused already, whichever way
    resumed = step(paused, Resume())
    assert resumed.status is SandboxStatus.IDLE and resumed.paused_mode is None
    # A memory pause records no mode (its records are as they were) and keeps its commands.
    frozen = step(busy, Pause())
    assert frozen.paused_mode is None and frozen.running == {"exec_1"}


_CANCELLED, _FAILED = (ExecutionStatus.CANCELLED, 137), (ExecutionStatus.FAILED, None)
_ENDS: list[tuple[Sequence[Command], str, tuple[ExecutionStatus, int | None]]] = [
    ((Destroy(),), "destroyed on request", _CANCELLED),
    ((Destroy(), Terminate("destroyed on request", deleted=True)), "destroyed on request", _CANCELLED),
    ((Destroy("paused timeout (1s) reached"), Terminate("paused timeout (1s) reached")), "paused timeout (1s) reached",
     _CANCELLED),
    ((Terminate("timeout (30s) reached"),), "timeout (30s) reached", _CANCELLED),
    ((Terminate("destroyed on request", deleted=True),), "destroyed on request", _CANCELLED),
    ((Destroy(), Fail("destroy failed: gone")), "destroyed on request", _CANCELLED),
    ((Fail("the host was lost"),), "the host was lost", _FAILED),
    ((Discard("its replica was lost"),), "its replica was lost", _FAILED),
]


@pytest.mark.parametrize(("ends", "reason", "outcome"), _ENDS,
                         ids=["+".join(type(c).__name__ for c in ends) for ends, _, _ in _ENDS])
@pytest.mark.parametrize("mode", [Mode.INTERACTIVE, Mode.ONESHOT])
def test_a_sandbox_that_ends_under_its_commands_ends_each_once_naming_the_end(
        ends: Sequence[Command], reason: str, outcome: tuple[ExecutionStatus, int | None], mode: Mode) -> None:
    """However a sandbox ends under running commands (a destroy, then its end; a busy sandbox's
    timeout, recorded as a destroy first; an end with no destroy before it; a failure; a
    survivor's discard), the first of those decides each command's end: one execution:finished,
    error ``sandbox ended: <reason>``, ``cancelled`` with exit 137 (``failed``, no exit code,
    where the sandbox failed), the same folded; the driver's report of the kill, whenever it
    comes, is refused, and the later ends decide no other."""
    from hutch.core.events import ExecutionFinished
    from hutch.core.lifecycle import evolve_execution

    sb = step(new(mode), Start())
    ids = ["exec_1"] if mode is Mode.ONESHOT else ["exec_1", "exec_2"]
    for eid in ids:
        sb = step(sb, StartExecution(eid, ("sleep", "30")))
    decided = decide_in_turn(sb, ends)
    finished = [e for e in decided if isinstance(e, ExecutionFinished)]
    assert sorted(f.execution_id for f in finished) == ids
    assert {(f.status, f.exit_code, f.error) for f in finished} == {(*outcome, f"sandbox ended: {reason}")}
    ended = fold(sb, decided)
    assert ended.running == frozenset()
    for eid in ids:
        with pytest.raises(IllegalTransition, match="not running"):
            decide(ended, FinishExecution(eid, ExecutionStatus.CANCELLED, exit_code=137, error="cancelled"))
    # Folded from the log, each execution reads as its one end event says.
    events = [Event(f"e{i}", sb.sandbox_id, f"2026-01-01T00:01:{i:02d}.000Z", d) for i, d in enumerate(decided)]
    for eid in ids:
        [started] = decide(step(new(mode), Start()), StartExecution(eid, ("sleep", "30")))
        ex = evolve_execution(None, Event("s", sb.sandbox_id, "2026-01-01T00:00:00.000Z", started))
        ex = reduce(evolve_execution, events, ex)  # type: ignore[arg-type]
        assert ex is not None and (ex.status, ex.exit_code, ex.error) == (*outcome, f"sandbox ended: {reason}")
        assert ex.duration_ms is not None and 60_000 <= ex.duration_ms < 70_000  # its start to its end recorded
    # A further end changes nothing of them.
    assert not [e for e in decide_in_turn(ended, (Terminate("later"),)) if isinstance(e, ExecutionFinished)]


def test_a_destroy_if_running_is_recorded_only_while_commands_run() -> None:
    """What an end that is not a destroy records first (service/control.py ``end``): decided
    under the lock, not on what its caller read: nothing for an idle sandbox; for one a
    command started in since, the destroy and that command's end."""
    idle = step(new(), Start())
    assert decide(idle, Destroy("idle timeout (1s) reached", if_running=True)) == []
    busy = step(idle, StartExecution("exec_1", ("sleep", "30")))
    events = decide(busy, Destroy("idle timeout (1s) reached", if_running=True))
    assert [e.type for e in events] == ["destroy", "execution:finished"]


def test_a_oneshot_ended_under_its_command_keeps_the_exit_code_its_end_says() -> None:
    """The commands' ends come before a terminate's end event: the sandbox's exit code is the
    terminate's (a oneshot's), not the killed command's 137."""
    sb = step(step(new(Mode.ONESHOT), Start()), StartExecution("exec_1", ("sleep", "30")))
    ended = step(sb, Terminate("the server restarted during the oneshot command", exit_code=3))
    assert ended.status is SandboxStatus.TERMINATED and ended.exit_code == 3


def test_the_log_keeps_the_start_of_a_long_argv_and_says_what_it_left_out() -> None:
    """An event is kept for ever in a log every tenant shares: a command's argv is recorded up to
    its first 4 KiB, with how many bytes were left out and the SHA-256 of the whole (the
    driver still runs the whole: it never reads the argv back from the log)."""
    import hashlib
    import json

    from hutch.core.events import ExecutionStarted, decode, encode
    from hutch.core.lifecycle import evolve_execution
    from hutch.core.limits import RECORDED_ARGV_BYTES, cmdline

    sb = step(new(), Start())
    argv = ("true", *(["a" * 131_000] * 3))
    [started] = decide(sb, StartExecution("exec_1", argv))
    assert isinstance(started, ExecutionStarted)
    assert started.command == ("true", "a" * (RECORDED_ARGV_BYTES - 5))
    assert started.command_omitted_bytes == len(cmdline(argv)) - RECORDED_ARGV_BYTES
    assert started.command_sha256 == hashlib.sha256(cmdline(argv)).hexdigest()
    event = Event("evt_1", "sbx_1", "2026-01-01T00:00:00.000Z", started)
    assert len(json.dumps(encode(event))) < RECORDED_ARGV_BYTES + 512
    ex = evolve_execution(None, decode(encode(event)))
    assert ex is not None and ex.command == started.command and ex.command_omitted_bytes == started.command_omitted_bytes
    # A short one is recorded whole, as before: the record's shape is unchanged.
    [short] = decide(sb, StartExecution("exec_2", ("ls", "-l")))
    assert isinstance(short, ExecutionStarted) and short.command == ("ls", "-l")
    assert set(encode(Event("evt_2", "sbx_1", "t", short))["data"]) == {"executionId", "command", "kind"}
    # A record written before the fields existed decodes, as "nothing left out".
    old = decode({"v": 1, "eventId": "evt_3", "sandboxId": "sbx_1", "type": "execution:started", "createdAt": "t",
                  "data": {"executionId": "exec_3", "command": ["ls"], "kind": "exec"}})
    assert isinstance(old.data, ExecutionStarted) and old.data.command_omitted_bytes is None
    # A create's command likewise, in its spec and as its queued execution.
    spec = SandboxSpec(runtime="base:latest", runtime_id="srt", command=argv)
    [created] = decide(None, Create(spec=spec, initial_execution_id="exec_4", initial_command=argv))
    assert isinstance(created, SandboxCreated)
    assert created.spec.command == started.command and created.initial_command == started.command
    assert created.spec.command_omitted_bytes == started.command_omitted_bytes
    queued = evolve_execution(None, Event("evt_4", "sbx_2", "t", created))
    assert queued is not None and queued.command_sha256 == started.command_sha256


@given(st.lists(st.text(alphabet=st.characters(blacklist_characters="\0"), max_size=3000), min_size=1, max_size=8))
def test_a_recorded_argv_is_the_start_of_the_whole_on_a_character_boundary(argv: list[str]) -> None:
    from hutch.core.limits import RECORDED_ARGV_BYTES, cmdline, recorded_argv

    whole, kept = cmdline(argv), recorded_argv(argv)
    if kept.omitted_bytes is None:
        assert kept.argv == tuple(argv) and len(whole) <= RECORDED_ARGV_BYTES and kept.sha256 is None
        return
    size = len(whole) - kept.omitted_bytes
    assert RECORDED_ARGV_BYTES - 3 <= size <= RECORDED_ARGV_BYTES  # a cut character is left out whole
    assert whole[:size] == cmdline(kept.argv)[:size]
    assert len(cmdline(kept.argv)) - size in (0, 1)  # 1: the last argument was cut (its NUL is not kept)


def test_the_idle_timeout_changes_while_the_sandbox_lives_and_not_after() -> None:
    sb = step(new(), Start())
    sb = step(sb, ChangeTimeout("5s"))
    assert sb.spec.timeout.idle == "5s" and sb.updated_at == "2026-01-01T00:00:00.000Z"
    assert step(sb, ChangeTimeout(None)).spec.timeout.idle is None
    with pytest.raises(InvalidInput, match=r"timeout\.idle"):
        decide(sb, ChangeTimeout("soon"))
    ended = step(step(sb, Destroy()), Terminate(reason="destroyed on request", deleted=True))
    with pytest.raises(IllegalTransition, match="cannot change the timeout"):
        decide(ended, ChangeTimeout("5s"))


def test_a_timeout_counted_from_its_setting_moves_only_when_set_or_resumed() -> None:
    """E2B's timeout (timeout.since "set"): from the create, a change of it or a resume; the
    commands run meanwhile do not move it. An idle timeout's sandbox records no such time."""
    def at(i: int, sb: SandboxState | None, command: Command) -> SandboxState:
        out = evolve_sandbox(sb, Event(f"evt_{i}", "sbx_1", f"2026-01-01T00:00:{i:02d}.000Z", decide(sb, command)[0]))
        assert out is not None
        return out

    spec = SandboxSpec(runtime="base:latest", runtime_id="srt", timeout=TimeoutSpec(idle="60s", since="set"))
    sb = at(1, None, Create(spec=spec))
    assert sb.timeout_set_at == "2026-01-01T00:00:01.000Z"
    sb = at(3, at(2, sb, Start()), StartExecution("exec_1", ("sleep", "9")))
    assert sb.status is SandboxStatus.RUNNING and sb.timeout_set_at == "2026-01-01T00:00:01.000Z"
    sb = at(4, sb, ChangeTimeout("5s"))
    assert sb.timeout_set_at == "2026-01-01T00:00:04.000Z" and sb.spec.timeout == TimeoutSpec(idle="5s", since="set")
    sb = at(5, sb, FinishExecution("exec_1", ExecutionStatus.COMPLETED, exit_code=0))
    sb = at(7, at(6, sb, Pause()), Resume())
    assert sb.status is SandboxStatus.IDLE and sb.timeout_set_at == "2026-01-01T00:00:07.000Z"
    idle = at(1, None, Create(spec=SandboxSpec(runtime="base:latest", runtime_id="srt", timeout=TimeoutSpec(idle="5s"))))
    assert at(2, idle, ChangeTimeout("9s")).timeout_set_at is None


def test_a_discard_is_decided_against_nothing_and_is_final() -> None:
    """A survivor ends a sandbox no event records (service/takeover.py): decided against nothing,
    it leaves a state no reader sees; a create and start folded onto it (a late append, decided
    by its replica against nothing too) stay failed with its reason."""
    [discarded] = decide(None, Discard("lost"))
    gone = fold(None, [discarded])
    assert gone.unrecorded and gone.status is SandboxStatus.FAILED and gone.reason == "lost"
    late = decide_in_turn(None, [Create(spec=SandboxSpec(runtime="base:latest", runtime_id="srt")), Start(node="n1"),
                                 StartExecution("exec_1", ("ls",))], "sbx_1")
    sb = fold(gone, late)
    assert not sb.unrecorded and sb.status is SandboxStatus.FAILED and sb.discarded == "lost"
    assert "lost" in (sb.reason or "") and sb.running == frozenset() and sb.node is None
    assert decide(sb, Discard("again")) == []  # over is over
    live = step(new(), Start())
    ended = step(live, Discard("lost"))
    assert ended.status is SandboxStatus.FAILED and ended.reason == "lost" and not ended.unrecorded
