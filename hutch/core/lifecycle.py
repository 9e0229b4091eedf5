"""The sandbox and execution state machines.

``decide(state, command) -> [events]`` checks a command against the current state and
says what happened; ``evolve(state, event) -> state`` folds one event. Folding is
``functools.reduce(evolve, events, None)``. An illegal command raises ``IllegalTransition``
and changes nothing; evolve never validates (the log is the truth, even if odd). Every
sandbox event is decided here, its creation too (``Create``, against no sandbox).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

import attrs

from hutch.core import limits
from hutch.core.errors import CheckpointNotFound, IllegalTransition, InvalidInput, SandboxNotFound
from hutch.core.events import (
    PAUSE_FILESYSTEM,
    CheckpointCreated,
    CheckpointDeleted,
    CheckpointRestored,
    Event,
    EventData,
    ExecutionFinished,
    ExecutionStarted,
    RuntimeBuildProgress,
    SandboxCompleted,
    SandboxCreated,
    SandboxDestroyRequested,
    SandboxDiscarded,
    SandboxEnvChanged,
    SandboxFailed,
    SandboxMoved,
    SandboxNetworkChanged,
    SandboxPaused,
    SandboxResumed,
    SandboxStarted,
    SandboxTerminated,
    SandboxTimeoutChanged,
    recorded_size,
)
from hutch.core.models import (
    CheckpointState,
    ExecutionState,
    ExecutionStatus,
    Mode,
    SandboxSpec,
    SandboxState,
    SandboxStatus,
)
from hutch.core.quantities import parse_duration

# ---------------------------------------------------------------- commands


@attrs.frozen
class Create:
    """Record a new sandbox: its spec as the server settled it (organization, project,
    defaults), the key that asked, and the command it runs at create, if any. That command
    is ``queued`` from the create on (``initial_command``) when it waits for a runtime build."""

    spec: SandboxSpec
    api_key_id: str | None = None
    initial_execution_id: str | None = None
    initial_command: tuple[str, ...] | None = None


@attrs.frozen
class Start:  # the driver made the sandbox real
    node: str | None = None  # where, when the driver places sandboxes on machines


@attrs.frozen
class Fail:
    reason: str


@attrs.frozen
class Discard:
    """A survivor ends a sandbox its lost replica made and no event records (or one whose
    create landed after the survivor looked): decided against nothing, too."""

    reason: str


@attrs.frozen
class Move:  # made again on another node from its files (an operator's drain)
    from_node: str
    to_node: str
    reason: str


@attrs.frozen
class ReportBuild:  # a step of the runtime build a creating sandbox waits for
    runtime: str
    message: str


@attrs.frozen
class StartExecution:
    execution_id: str
    command: tuple[str, ...]
    timeout_seconds: float | None = None
    kind: str = "exec"


@attrs.frozen
class FinishExecution:
    execution_id: str
    status: ExecutionStatus
    exit_code: int | None = None
    duration_ms: int | None = None
    error: str | None = None
    output_truncated: bool = False


DESTROYED_ON_REQUEST = "destroyed on request"


@attrs.frozen
class Destroy:
    reason: str = DESTROYED_ON_REQUEST
    # Only if commands run: a sandbox ended for another reason (a timeout, a oneshot's end) is
    # recorded ending before the driver kills them, whatever its caller read of it before.
    if_running: bool = False


@attrs.frozen
class Terminate:
    """End a sandbox that is not being destroyed on request (oneshot done, reaped, host died)."""

    reason: str
    exit_code: int | None = None
    deleted: bool = False
    cpu_seconds: float | None = None  # usage, as the driver reported it just before the end
    memory_peak_bytes: int | None = None


@attrs.frozen
class ChangeEnv:
    set: dict[str, str]
    unset: tuple[str, ...] = ()


@attrs.frozen
class ChangeNetwork:
    """A live sandbox's egress rules replaced whole (its port stays)."""

    enabled: bool
    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()


@attrs.frozen
class ChangeTimeout:
    idle: str | None  # a duration such as 300s (checked); None: no idle timeout


@attrs.frozen
class TakeCheckpoint:
    checkpoint_id: str
    name: str


@attrs.frozen
class RestoreCheckpoint:
    checkpoint_id: str


@attrs.frozen
class DeleteCheckpoint:
    checkpoint_id: str


PAUSED_FILESYSTEM_ENDED = "cancelled: the sandbox was paused filesystem-only, which ends every process in it"
# A command its sandbox's end stops (a destroy, a timeout, a oneshot's destroy): ``cancelled``,
# as the seeds call a command a user's action terminated, SIGKILLed with the rest of the
# sandbox (128 + 9, as a cancel's), its error naming the end. One a failure of its sandbox
# stops (its host lost, its allocation killed) is ``failed`` as the sandbox is, its exit code
# unknown: the driver's own report of such a loss, which may land first, says failed too.
ENDED_EXIT_CODE = 137


def sandbox_ended(reason: str) -> str:
    """The error of a command its sandbox's end stopped."""
    return f"sandbox ended: {reason}"


@attrs.frozen
class Pause:
    terminates_at: str | None = None
    mode: str | None = None  # None: memory kept (frozen); PAUSE_FILESYSTEM: only its files (SandboxPaused)


@attrs.frozen
class Resume:
    auto: bool = False


Command = (
    Create | Start | Fail | Discard | Move | ReportBuild | StartExecution | FinishExecution | Destroy | Terminate | Pause | Resume | ChangeEnv
    | ChangeTimeout | ChangeNetwork | TakeCheckpoint | RestoreCheckpoint | DeleteCheckpoint
)

_LIVE = (SandboxStatus.IDLE, SandboxStatus.RUNNING)


def _illegal(sandbox: SandboxState, what: str) -> IllegalTransition:
    return IllegalTransition(
        f"cannot {what}: sandbox {sandbox.sandbox_id} is {sandbox.status.value}",
        sandbox_id=sandbox.sandbox_id,
        sandbox_status=sandbox.status.value,
    )


def checkpoint_id_for(sandbox: SandboxState, ref: str) -> str:
    """A checkpoint named by its id or, as the seeds' CLI allows, by its name (names are unique
    per sandbox). An unknown ref is returned as it is: ``decide`` says it is not found."""
    if any(c.checkpoint_id == ref for c in sandbox.checkpoints):
        return ref
    return next((c.checkpoint_id for c in sandbox.checkpoints if c.name == ref), ref)


# What decide can say happened: the sandbox lifecycle's events (snapshots and tenancy are
# decided elsewhere).
Decided = (
    SandboxCreated
    | SandboxStarted
    | SandboxMoved
    | SandboxFailed
    | SandboxDiscarded
    | RuntimeBuildProgress
    | CheckpointCreated
    | CheckpointRestored
    | CheckpointDeleted
    | SandboxEnvChanged
    | SandboxTimeoutChanged
    | SandboxNetworkChanged
    | SandboxPaused
    | SandboxResumed
    | ExecutionStarted
    | ExecutionFinished
    | SandboxDestroyRequested
    | SandboxCompleted
    | SandboxTerminated
)


def decide(sandbox: SandboxState | None, command: Command) -> list[Decided]:
    """Event payloads the command produces (the caller wraps them in envelopes). ``sandbox``
    is None where none is recorded: only a ``Create`` goes there."""
    if isinstance(command, Create):
        return _decide_create(sandbox, command)
    if isinstance(command, Discard):
        # Nothing recorded, or recorded and not over: ended now (the caller ends it wherever it runs).
        if sandbox is None:
            return [SandboxDiscarded(reason=command.reason)]
        if sandbox.status.is_final:
            return []
        return [*_stopped(sandbox, sandbox_ended(command.reason), failed=True), SandboxDiscarded(reason=command.reason)]
    if sandbox is None:
        raise SandboxNotFound("sandbox not found: nothing but a create is decided before it is recorded")
    match command:
        case Start() | Fail() | ReportBuild():
            return _decide_setup(sandbox, command)
        case TakeCheckpoint():
            return _decide_take_checkpoint(sandbox, command)
        case RestoreCheckpoint() | DeleteCheckpoint():
            return _decide_checkpoint_change(sandbox, command)
        case ChangeEnv():
            return _decide_change_env(sandbox, command)
        case ChangeTimeout():
            if sandbox.status.is_final or sandbox.status is SandboxStatus.STOPPING:
                raise _illegal(sandbox, "change the timeout")
            if command.idle is not None:
                parse_duration("timeout.idle", command.idle)
            return [SandboxTimeoutChanged(idle=command.idle)]
        case ChangeNetwork():
            if sandbox.status.is_final or sandbox.status in (SandboxStatus.STOPPING, SandboxStatus.CREATING):
                raise _illegal(sandbox, "change the network")
            if command.allow and command.deny:
                raise InvalidInput("network.deny: with network.allow everything it does not list is denied already; "
                                   "give one of them", field="network.deny")
            if not command.enabled and (command.allow or command.deny):
                raise InvalidInput("network: a network turned off has no allow- or deny-list", field="network")
            return [SandboxNetworkChanged(enabled=command.enabled, allow=command.allow, deny=command.deny)]
        case Move():
            return _decide_move(sandbox, command)
        case Pause():
            return _decide_pause(sandbox, command)
        case Resume():
            return _decide_resume(sandbox, command)
        case StartExecution():
            return _decide_start_execution(sandbox, command)
        case FinishExecution():
            return _decide_finish_execution(sandbox, command)
        case Destroy() | Terminate():
            return _decide_end(sandbox, command)
    raise TypeError(f"unknown command {command!r}")  # pragma: no cover


def decide_in_turn(sandbox: SandboxState | None, commands: Sequence[Command], sandbox_id: str = "") -> list[Decided]:
    """What ``commands`` produce, each decided against the sandbox as the events of the ones
    before it leave it: events recorded as one append (a create's ``Start`` and its command's
    ``StartExecution``; a sandbox's ``Create`` first, ``sandbox`` None and its id given), so
    that one refusal refuses them all."""
    decided: list[Decided] = []
    state: SandboxState | None = sandbox
    sid, at = (sandbox.sandbox_id, sandbox.updated_at) if sandbox is not None else (sandbox_id, "")
    for command in commands:
        events = decide(state, command)
        for data in events:
            state = _evolve(state, Event("", sid, at, data))
        decided.extend(events)
    return decided


def _decide_create(sandbox: SandboxState | None, command: Create) -> list[Decided]:
    """A sandbox id is used once: a create never lands on a recorded sandbox, whatever its state."""
    if sandbox is not None:
        raise _illegal(sandbox, "create it again")
    if command.initial_command is not None and command.initial_execution_id is None:
        # The queued command is read back as an execution under that id (evolve_execution).
        raise InvalidInput("a create's queued command needs its execution id", field="command")
    spec, initial = command.spec, command.initial_command
    if spec.command is not None:  # the log keeps the command's first 4 KiB (core.limits.recorded_argv)
        kept = limits.recorded_argv(spec.command)
        spec = attrs.evolve(spec, command=kept.argv, command_omitted_bytes=kept.omitted_bytes,
                            command_sha256=kept.sha256)
    if initial is not None:
        initial = limits.recorded_argv(initial).argv
    return [SandboxCreated(spec=spec, api_key_id=command.api_key_id,
                           initial_execution_id=command.initial_execution_id, initial_command=initial)]


def _decide_setup(sandbox: SandboxState, command: Start | Fail | ReportBuild) -> list[Decided]:
    """The creating sandbox: the driver made it real, it failed, or its runtime builds."""
    status = sandbox.status
    match command:
        case Start():
            if status is not SandboxStatus.CREATING:
                raise _illegal(sandbox, "start")
            return [SandboxStarted(node=command.node)]
        case Fail(reason=reason):
            if status.is_final:
                return []  # failing something already over changes nothing
            return [*_stopped(sandbox, sandbox_ended(reason), failed=True), SandboxFailed(reason=reason)]
        case ReportBuild(runtime=runtime, message=message):
            if status is not SandboxStatus.CREATING:
                return []  # destroyed while its runtime builds: the build goes on for others
            return [RuntimeBuildProgress(runtime=runtime, message=message)]


def _decide_take_checkpoint(sandbox: SandboxState, command: TakeCheckpoint) -> list[Decided]:
    status, name = sandbox.status, command.name
    if status not in _LIVE and status is not SandboxStatus.PAUSED:
        raise _illegal(sandbox, "checkpoint")
    if any(c.name == name for c in sandbox.checkpoints):
        raise IllegalTransition(
            f"name: sandbox {sandbox.sandbox_id} already has a checkpoint named {name!r}",
            sandbox_id=sandbox.sandbox_id, field="name",
        )
    return [CheckpointCreated(checkpoint_id=command.checkpoint_id, name=name, parent=sandbox.current_checkpoint)]


def _decide_checkpoint_change(sandbox: SandboxState, command: RestoreCheckpoint | DeleteCheckpoint) -> list[Decided]:
    """Restore or delete an existing checkpoint: both need a live or paused sandbox and a known id."""
    status, cid = sandbox.status, command.checkpoint_id
    verb = "restore" if isinstance(command, RestoreCheckpoint) else "delete"
    if status not in _LIVE and status is not SandboxStatus.PAUSED:
        raise _illegal(sandbox, f"{verb} a checkpoint")
    if not any(c.checkpoint_id == cid for c in sandbox.checkpoints):
        raise CheckpointNotFound(
            f"checkpoint {cid} not found in sandbox {sandbox.sandbox_id} (no checkpoint has that id or "
            "name: deleted, or never taken)",
            sandbox_id=sandbox.sandbox_id,
        )
    if isinstance(command, RestoreCheckpoint) and status is SandboxStatus.RUNNING:
        raise IllegalTransition(
            f"cannot restore: sandbox {sandbox.sandbox_id} has running executions; wait for them or cancel them",
            sandbox_id=sandbox.sandbox_id, sandbox_status=status.value,
        )
    return [CheckpointRestored(cid) if verb == "restore" else CheckpointDeleted(cid)]


def _decide_change_env(sandbox: SandboxState, command: ChangeEnv) -> list[Decided]:
    status = sandbox.status
    if status.is_final or status is SandboxStatus.STOPPING:
        raise _illegal(sandbox, "change the environment")
    if not command.set and not command.unset:
        return []
    # Judged on the env it would make: small changes add up, and every command starts with it.
    env = {k: v for k, v in sandbox.spec.env.items() if k not in command.unset}
    limits.check_env({**env, **command.set})
    return [SandboxEnvChanged(set=dict(command.set), unset=tuple(command.unset))]


def _decide_move(sandbox: SandboxState, command: Move) -> list[Decided]:
    """Only an idle sandbox moves (nothing runs that would be cut off), from where the log says
    it is, to another node; its checkpoints stay on their node, so one that has any does not."""
    if sandbox.status is not SandboxStatus.IDLE:
        raise _illegal(sandbox, "move it (only an idle sandbox moves)")
    if sandbox.node != command.from_node or command.to_node == command.from_node:
        raise IllegalTransition(f"cannot move sandbox {sandbox.sandbox_id} from {command.from_node} to "
                                f"{command.to_node}: it runs on {sandbox.node}", sandbox_id=sandbox.sandbox_id,
                                sandbox_status=sandbox.status.value)
    if sandbox.checkpoints:
        raise IllegalTransition(f"cannot move sandbox {sandbox.sandbox_id}: its checkpoints are kept on "
                                f"{sandbox.node} and would not follow", sandbox_id=sandbox.sandbox_id,
                                sandbox_status=sandbox.status.value)
    return [SandboxMoved(from_node=command.from_node, to_node=command.to_node, reason=command.reason)]


def _decide_pause(sandbox: SandboxState, command: Pause) -> list[Decided]:
    """An idle or running sandbox pauses: its running commands are frozen with it and stay
    ``running`` (as E2B's), their time limits standing still; the resume makes it running again
    if any is left. A driver that cannot freeze a running command refuses, naming why. A
    filesystem-only pause (``mode``) ends every process instead, its commands cancelled
    (_stopped); its resume is a new boot over the same files."""
    status = sandbox.status
    if status is SandboxStatus.PAUSED:
        return []  # pausing a paused sandbox changes nothing (whichever way it paused)
    if status not in _LIVE:
        raise _illegal(sandbox, "pause")
    paused = SandboxPaused(terminates_at=command.terminates_at, mode=command.mode)
    if command.mode != PAUSE_FILESYSTEM:
        return [paused]
    return [paused, *_stopped(sandbox, PAUSED_FILESYSTEM_ENDED)]


def _decide_resume(sandbox: SandboxState, command: Resume) -> list[Decided]:
    status = sandbox.status
    if status in _LIVE:
        return []  # already awake
    if status is not SandboxStatus.PAUSED:
        raise _illegal(sandbox, "resume")
    return [SandboxResumed(auto=command.auto)]


def _decide_start_execution(sandbox: SandboxState, command: StartExecution) -> list[Decided]:
    status = sandbox.status
    if status is SandboxStatus.PAUSED:
        raise IllegalTransition(
            f"cannot execute: sandbox {sandbox.sandbox_id} is paused; resume it first",
            sandbox_id=sandbox.sandbox_id,
            sandbox_status=status.value,
        )
    if status not in _LIVE:
        raise _illegal(sandbox, "execute")
    if sandbox.spec.mode is Mode.ONESHOT and sandbox.executions >= 1:
        raise _illegal(sandbox, "execute in a oneshot sandbox")
    kept = limits.recorded_argv(command.command)  # the driver runs the whole; the log keeps its start
    return [
        ExecutionStarted(
            execution_id=command.execution_id,
            command=kept.argv,
            timeout_seconds=command.timeout_seconds,
            kind=command.kind,
            command_omitted_bytes=kept.omitted_bytes,
            command_sha256=kept.sha256,
        )
    ]


def _decide_finish_execution(sandbox: SandboxState, command: FinishExecution) -> list[Decided]:
    if command.execution_id not in sandbox.running:
        raise IllegalTransition(
            f"execution {command.execution_id} is not running in sandbox {sandbox.sandbox_id}",
            sandbox_id=sandbox.sandbox_id,
        )
    finished = ExecutionFinished(
        execution_id=command.execution_id,
        status=command.status,
        exit_code=command.exit_code,
        duration_ms=command.duration_ms,
        error=command.error,
        output_truncated=command.output_truncated,
    )
    return [finished]


def _stopped(sandbox: SandboxState, error: str, *, failed: bool = False) -> list[ExecutionFinished]:
    """The end of every command still running in a sandbox that ends (or pauses filesystem-only)
    under them, decided here with the end itself, in the same append: one outcome, whatever the
    driver reports of their kill and whenever (that report comes after, and is refused: they are
    no longer running), and one ``execution:finished`` for each: after a destroy's request or a
    pause, before a terminate's or a failure's end (which would fold the sandbox's exit code)."""
    status, code = (ExecutionStatus.FAILED, None) if failed else (ExecutionStatus.CANCELLED, ENDED_EXIT_CODE)
    return [ExecutionFinished(execution_id=eid, status=status, exit_code=code, error=error)
            for eid in sorted(sandbox.running)]


def _decide_end(sandbox: SandboxState, command: Destroy | Terminate) -> list[Decided]:
    """Destroy on request, or terminate for any other reason (a oneshot's exit code completes
    it). Its running commands end with the first of them (_stopped): a destroy's, or a busy
    sandbox's ending (recorded as a destroy with its reason), before the driver kills them."""
    status = sandbox.status
    if isinstance(command, Destroy):
        if status in (SandboxStatus.DELETED, SandboxStatus.STOPPING):
            return []  # destroy is idempotent
        if command.if_running and not sandbox.running:
            return []
        return [SandboxDestroyRequested(reason=command.reason), *_stopped(sandbox, sandbox_ended(command.reason))]
    if status in (SandboxStatus.DELETED,) or (status.is_final and not command.deleted):
        return []
    events: list[Decided] = [*_stopped(sandbox, sandbox_ended(command.reason))]
    if sandbox.spec.mode is Mode.ONESHOT and command.exit_code is not None and status in _LIVE:
        events.append(SandboxCompleted(exit_code=command.exit_code))
    events.append(
        SandboxTerminated(reason=command.reason, deleted=command.deleted, exit_code=command.exit_code,
                          cpu_seconds=command.cpu_seconds, memory_peak_bytes=command.memory_peak_bytes)
    )
    return events


# ---------------------------------------------------------------- evolve


def evolve_sandbox(sandbox: SandboxState | None, event: Event) -> SandboxState | None:
    """The sandbox after ``event``, its events' bytes in the log counted (``log_bytes``)."""
    evolved = _evolve(sandbox, event)
    if evolved is None:
        return None
    return attrs.evolve(evolved, log_bytes=evolved.log_bytes + recorded_size(event))


def _evolve(sandbox: SandboxState | None, event: Event) -> SandboxState | None:
    data, at = event.data, event.created_at
    if isinstance(data, SandboxCreated):
        created = SandboxState(
            sandbox_id=event.sandbox_id,
            spec=data.spec,
            status=SandboxStatus.CREATING,
            created_at=at,
            updated_at=at,
            timeout_set_at=_set_at(data.spec, at),
            api_key_id=data.api_key_id,
            initial_execution_id=data.initial_execution_id,
        )
        if sandbox is None:
            return created
        if sandbox.unrecorded:
            # Appended after a survivor ended it (its append began while its replica's lease
            # held, and landed late): what it records is gone, so it is over from the start.
            # The discard's bytes stay counted: the log keeps it too.
            return attrs.evolve(created, status=SandboxStatus.FAILED, discarded=sandbox.discarded,
                                reason=f"{sandbox.discarded}; its create was recorded only after that",
                                log_bytes=sandbox.log_bytes)
        # Recorded already: ``decide`` makes one create per id, so this is the log's own
        # duplicate (eventlog/kafka.py: a batch resolved after a failed Produce can be written
        # twice). It changes nothing: an ended sandbox is not made live again.
        return sandbox
    if isinstance(data, SandboxDiscarded):
        return _evolve_discarded(sandbox, event, data, at)
    if sandbox is None:
        return None  # an event for a sandbox we never saw created: nothing to fold into
    match data:
        case CheckpointCreated() | CheckpointRestored() | CheckpointDeleted():
            return _evolve_checkpoints(sandbox, data, at)
        case ExecutionStarted() | ExecutionFinished():
            return _evolve_executions(sandbox, data, at)
        case SandboxTimeoutChanged():
            timeout = attrs.evolve(sandbox.spec.timeout, idle=data.idle)
            return attrs.evolve(sandbox, spec=attrs.evolve(sandbox.spec, timeout=timeout), updated_at=at,
                                timeout_set_at=_set_at(sandbox.spec, at))
        case SandboxNetworkChanged():
            network = attrs.evolve(sandbox.spec.network, enabled=data.enabled, allow=data.allow, deny=data.deny)
            return attrs.evolve(sandbox, spec=attrs.evolve(sandbox.spec, network=network), updated_at=at)
        case SandboxEnvChanged():
            env = {k: v for k, v in sandbox.spec.env.items() if k not in data.unset}
            env.update(data.set)
            return attrs.evolve(sandbox, spec=attrs.evolve(sandbox.spec, env=env), updated_at=at)
        case SandboxTerminated():
            return _evolve_terminated(sandbox, data, at)
        case _:
            return _evolve_status(sandbox, data, at)


def _evolve_discarded(sandbox: SandboxState | None, event: Event, data: SandboxDiscarded,
                      at: str) -> SandboxState:
    """Nothing recorded: a state that holds only why and whose it is (``unrecorded``: no reader
    sees it as a sandbox), for a create that lands late to fold into; its organization is the
    envelope's (its owner row's: service/takeover.py), "" in records from before that was kept
    (nobody's). Recorded meanwhile (the create landed before the survivor appended this):
    failed, as it is gone. Over already: as it was."""
    if sandbox is None:
        spec = SandboxSpec(runtime="", runtime_id="", org_id=event.org or "", project_id=event.project)
        return SandboxState(sandbox_id=event.sandbox_id, spec=spec, status=SandboxStatus.FAILED, created_at="",
                            updated_at=at, reason=data.reason, discarded=data.reason)
    if sandbox.status.is_final:
        return sandbox
    return attrs.evolve(sandbox, status=SandboxStatus.FAILED, reason=data.reason, discarded=data.reason,
                        running=frozenset(), paused_at=None, terminates_at=None, updated_at=at)


def _evolve_status(sandbox: SandboxState, data: EventData, at: str) -> SandboxState:
    """The sandbox's own status events; any other event leaves it as it is."""
    match data:
        case SandboxStarted() if sandbox.status.is_final:
            return sandbox  # a start appended after its end (a late append): over is over
        case SandboxStarted(node=node):
            return attrs.evolve(sandbox, status=SandboxStatus.IDLE, node=node, updated_at=at)
        case SandboxMoved(to_node=node):
            return attrs.evolve(sandbox, node=node, updated_at=at)
        case SandboxFailed(reason=reason):
            return attrs.evolve(sandbox, status=SandboxStatus.FAILED, reason=reason, running=frozenset(), updated_at=at)
        case SandboxDestroyRequested():
            return attrs.evolve(sandbox, status=SandboxStatus.STOPPING, updated_at=at)
        case SandboxPaused(terminates_at=deadline, mode=mode):
            # A filesystem-only pause ended every process: none of its commands is left running
            # (each ended by its own execution:finished, decided with the pause: _stopped).
            running = frozenset() if mode == PAUSE_FILESYSTEM else sandbox.running
            return attrs.evolve(sandbox, status=SandboxStatus.PAUSED, paused_at=at, terminates_at=deadline, updated_at=at,
                                paused_mode=mode, running=running)
        case SandboxResumed():
            status = SandboxStatus.RUNNING if sandbox.running else SandboxStatus.IDLE
            # A timeout counted from when it was set starts again at a resume (E2B's connect
            # resumes a paused sandbox for its timeout from then): it did not run while paused.
            return attrs.evolve(sandbox, status=status, paused_at=None, terminates_at=None, updated_at=at,
                                paused_mode=None, timeout_set_at=_set_at(sandbox.spec, at))
        case SandboxCompleted(exit_code=code):
            return attrs.evolve(sandbox, exit_code=code, updated_at=at)
    return sandbox


def _set_at(spec: SandboxSpec, at: str) -> str | None:
    """When the timeout counts from, for a sandbox whose timeout counts from when it was set."""
    return at if spec.timeout.since == "set" else None


def _evolve_terminated(sandbox: SandboxState, data: SandboxTerminated, at: str) -> SandboxState:
    status = SandboxStatus.DELETED if data.deleted else SandboxStatus.TERMINATED
    exit_code = data.exit_code if data.exit_code is not None else sandbox.exit_code
    return attrs.evolve(
        sandbox, status=status, reason=data.reason, exit_code=exit_code, running=frozenset(),
        paused_at=None, terminates_at=None, paused_mode=None, updated_at=at,
        cpu_seconds=data.cpu_seconds if data.cpu_seconds is not None else sandbox.cpu_seconds,
        memory_peak_bytes=(data.memory_peak_bytes if data.memory_peak_bytes is not None
                           else sandbox.memory_peak_bytes),
    )


def _evolve_checkpoints(
    sandbox: SandboxState, data: CheckpointCreated | CheckpointRestored | CheckpointDeleted, at: str
) -> SandboxState:
    match data:
        case CheckpointCreated():
            cp = CheckpointState(checkpoint_id=data.checkpoint_id, name=data.name, created_at=at, parent=data.parent)
            return attrs.evolve(sandbox, checkpoints=(*sandbox.checkpoints, cp), current_checkpoint=data.name, updated_at=at)
        case CheckpointRestored(checkpoint_id=cid):
            name = next((c.name for c in sandbox.checkpoints if c.checkpoint_id == cid), sandbox.current_checkpoint)
            return attrs.evolve(sandbox, current_checkpoint=name, updated_at=at)
        case CheckpointDeleted(checkpoint_id=cid):
            kept = tuple(c for c in sandbox.checkpoints if c.checkpoint_id != cid)
            return attrs.evolve(sandbox, checkpoints=kept, updated_at=at)


def _evolve_executions(sandbox: SandboxState, data: ExecutionStarted | ExecutionFinished, at: str) -> SandboxState:
    """An execution starts (the sandbox runs) or finishes (it idles once none runs)."""
    if isinstance(data, ExecutionStarted):
        if sandbox.status.is_final:  # appended with a late start, after the end: it never ran here
            return attrs.evolve(sandbox, executions=sandbox.executions + 1, updated_at=at)
        running = sandbox.running | {data.execution_id}
        status = SandboxStatus.RUNNING if sandbox.status in _LIVE else sandbox.status
        return attrs.evolve(sandbox, running=running, executions=sandbox.executions + 1, status=status, updated_at=at)
    running = sandbox.running - {data.execution_id}
    status = sandbox.status
    if status is SandboxStatus.RUNNING and not running:
        status = SandboxStatus.IDLE
    return attrs.evolve(sandbox, running=running, status=status, exit_code=data.exit_code, updated_at=at)


def evolve_execution(execution: ExecutionState | None, event: Event) -> ExecutionState | None:
    data, at = event.data, event.created_at
    if isinstance(data, SandboxCreated) and data.initial_command is not None:
        return ExecutionState(execution_id=data.initial_execution_id or "", sandbox_id=event.sandbox_id,
                         command=data.initial_command, status=ExecutionStatus.QUEUED, created_at=at,
                         command_omitted_bytes=data.spec.command_omitted_bytes,
                         command_sha256=data.spec.command_sha256)
    if isinstance(data, ExecutionStarted):
        return ExecutionState(
            execution_id=data.execution_id,
            sandbox_id=event.sandbox_id,
            command=data.command,
            status=ExecutionStatus.RUNNING,
            created_at=execution.created_at if execution is not None else at,  # queued since then
            started_at=at,
            type=data.kind,
            timeout_seconds=data.timeout_seconds,
            command_omitted_bytes=data.command_omitted_bytes,
            command_sha256=data.command_sha256,
        )
    if execution is None:
        return None
    if isinstance(data, ExecutionFinished):
        return attrs.evolve(
            execution,
            status=data.status,
            exit_code=data.exit_code,
            # An end the driver did not time (one its sandbox's end decided, a restart's):
            # from its recorded start to its recorded end.
            duration_ms=data.duration_ms if data.duration_ms is not None else _ms_between(execution.started_at, at),
            error=data.error,
            output_truncated=data.output_truncated,
            completed_at=at,
        )
    if isinstance(data, SandboxPaused) and data.mode == PAUSE_FILESYSTEM and not execution.status.is_final:
        # Its processes ended with the pause (a log from before the pause decided an
        # execution:finished for each: _stopped); the driver's report of the kill is refused.
        return attrs.evolve(execution, status=ExecutionStatus.CANCELLED, error=PAUSED_FILESYSTEM_ENDED,
                            completed_at=at)
    if isinstance(data, (SandboxTerminated, SandboxFailed, SandboxDiscarded)) and not execution.status.is_final:
        # A queued command whose sandbox ended before it started, or a running one in a log
        # recorded before an end decided its running commands' ends too (_stopped).
        return attrs.evolve(
            execution,
            status=ExecutionStatus.CANCELLED if isinstance(data, SandboxTerminated) else ExecutionStatus.FAILED,
            error=f"sandbox ended: {data.reason}",
            completed_at=at,
        )
    return execution


def _ms_between(start: str | None, end: str) -> int | None:
    """Milliseconds between two recorded times (ISO 8601, ``Z``); None if either is not one."""
    if not start:
        return None
    try:
        begun, ended = (dt.datetime.fromisoformat(t.replace("Z", "+00:00")) for t in (start, end))
        return max(0, int((ended - begun).total_seconds() * 1000))
    except (ValueError, TypeError):
        return None


def execution_in(sandbox: SandboxState | None, execution: ExecutionState, at: str) -> ExecutionState:
    """``execution`` as its sandbox (after the same event) allows: one recorded started or queued
    in a sandbox that is over already (appended with a late create, after a survivor ended the
    sandbox: ``lifecycle:discarded``) never ran, and is failed with the sandbox's reason."""
    if sandbox is None or not sandbox.status.is_final or execution.status.is_final:
        return execution
    return attrs.evolve(execution, status=ExecutionStatus.FAILED, error=f"sandbox ended: {sandbox.reason}",
                        completed_at=at)


def execution_id_of(event: Event) -> str | None:
    data = event.data
    if isinstance(data, (ExecutionStarted, ExecutionFinished)):
        return data.execution_id
    if isinstance(data, SandboxCreated) and data.initial_command is not None:
        return data.initial_execution_id
    return None
