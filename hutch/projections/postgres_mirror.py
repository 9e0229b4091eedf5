"""What the PostgreSQL projection store wrote last, kept in the process: a batch whose state is
all here is folded without ``LOAD``, one round trip of the two a batch costs.

Why it is safe: ``WRITE`` takes effect only if the store's position is still the one it names
(``postgres_sql``). The mirror names the position of its own last write; every write to the
tables moves the position (another projector's batch, a skip, a reset, a rebuild), so a write
that takes effect proves no one wrote since and the rows here are the rows there. One that
does not take effect clears the mirror, and the batch is loaded and looked at again, as
before: nothing is ever written from rows the store no longer holds.

What it holds, per sandbox a batch touched: the sandbox, its executions that are not final
(with their ``seq``) and the ids of those that are, as far as it knows them; and whether it
knows every execution the sandbox has (``full``: the store held nothing of the sandbox when it
was loaded, its creation; every execution it has since came through a write here). A sandbox
the batch creates (its first event there is its creation) and not held here is folded as new,
on a further condition of the ``WRITE``: that the store has no row of it (``absent``); ids are
minted, so that holds but for a create appended twice, which the condition sends to ``LOAD``.
A batch touching any other sandbox not held here, naming an execution that is final or, in a sandbox not
``full``, not known here, or carrying a snapshot or tenancy event, is loaded as before. (An
execution's row is written only by its own sandbox's events: ids are minted, so an id not
seen in a ``full`` sandbox is a new execution.) An ended sandbox is dropped (nothing more
happens to it, and the mirror would otherwise grow with every sandbox ever made), and beyond
``LIMIT`` sandboxes the one written longest ago (many idle sandboxes: loading one again is
all that costs, and the API's memory per idle sandbox stays what it was).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import attrs

from hutch.core.events import Event, SandboxCreated
from hutch.core.lifecycle import execution_id_of
from hutch.core.models import ExecutionState, SandboxState
from hutch.core.snapshots import is_snapshot_event
from hutch.projections.base import is_tenancy_event

LIMIT = 1_000
# Final executions remembered per sandbox; past it the sandbox is no longer ``full`` (a long-lived
# sandbox's every command would otherwise stay here: its new executions' starts are loaded then).
FINISHED_LIMIT = 256


@attrs.define
class _Held:
    sandbox: SandboxState | None  # None: the store has no row for it (not created yet)
    full: bool  # every execution it has is in ``open`` or ``finished``
    open: dict[str, tuple[int, ExecutionState]] = attrs.field(factory=dict)  # id -> (seq, state)
    finished: set[str] = attrs.field(factory=set)  # final executions, by id only


@attrs.frozen
class Loaded:
    """The state a batch touches, as ``LOAD`` would have read it."""

    sandboxes: dict[str, SandboxState]
    executions: dict[str, ExecutionState]
    seqs: dict[str, int]
    by_sandbox: dict[str, list[str]]
    absent: tuple[str, ...] = ()  # sandboxes taken to have nothing in the store (WRITE checks it)


class Mirror:
    def __init__(self) -> None:
        self.position: int | None = None  # the store's position when these rows were its rows
        self._held: dict[str, _Held] = {}

    def clear(self) -> None:
        self.position = None
        self._held.clear()

    def state_for(self, events: Sequence[Event]) -> Loaded | None:
        """The state ``events`` touch, if all of it is here; None: load it."""
        if self.position is None:
            return None
        held: dict[str, _Held] = {}
        absent: list[str] = []
        for e in events:
            if is_snapshot_event(e) or is_tenancy_event(e):
                return None
            h = held.get(e.sandbox_id) or self._held.get(e.sandbox_id)
            if h is None:
                if not isinstance(e.data, SandboxCreated):
                    return None
                h = _Held(None, full=True)  # new: the WRITE checks the store has nothing of it
                absent.append(e.sandbox_id)
            held[e.sandbox_id] = h
            eid = execution_id_of(e)
            if eid is not None and eid not in h.open and (eid in h.finished or not h.full):
                return None  # a final execution (its state is not kept), or one not known here
        sandboxes: dict[str, SandboxState] = {}
        executions: dict[str, ExecutionState] = {}
        seqs: dict[str, int] = {}
        by_sandbox: dict[str, list[str]] = {}
        for sandbox_id, h in held.items():
            if h.sandbox is not None:
                sandboxes[sandbox_id] = h.sandbox
            for eid, (seq, ex) in sorted(h.open.items(), key=lambda kv: kv[1][0]):
                executions[eid] = ex
                seqs[eid] = seq
                by_sandbox.setdefault(sandbox_id, []).append(eid)
        return Loaded(sandboxes, executions, seqs, by_sandbox, tuple(absent))

    def loaded(self, position: int, state: Loaded, sandbox_ids: Iterable[str]) -> None:
        """``LOAD`` read ``state`` at ``position`` (every open execution of ``sandbox_ids``), or
        ``state_for`` gave it with ``absent`` sandboxes that a WRITE then found so."""
        if position != self.position:
            self._held.clear()  # held as of another position: someone wrote in between
        self.position = position
        for sandbox_id in sandbox_ids:
            if sandbox_id in self._held and sandbox_id not in state.absent:
                continue  # held as of this very position, and perhaps knowing more (``full``)
            sb = state.sandboxes.get(sandbox_id)
            execs = state.by_sandbox.get(sandbox_id, [])
            h = self._held[sandbox_id] = _Held(sb, full=sb is None and not execs)
            for eid in execs:
                ex = state.executions[eid]
                if ex.status.is_final:
                    h.finished.add(eid)
                else:
                    h.open[eid] = (state.seqs[eid], ex)

    def wrote(self, position: int, events: Sequence[Event], sandboxes: Iterable[SandboxState],
              executions: Iterable[ExecutionState], seqs: dict[str, int]) -> None:
        """``WRITE`` took effect at ``position`` with these changed rows (from a state the
        mirror gave or ``loaded`` took in)."""
        self.position = position
        for sb in sandboxes:
            h = self._held.get(sb.sandbox_id)
            if h is not None:
                h.sandbox = sb
        for ex in executions:
            h = self._held.get(ex.sandbox_id)
            if h is None:
                continue
            if ex.status.is_final:
                h.open.pop(ex.execution_id, None)
                h.finished.add(ex.execution_id)
                if len(h.finished) > FINISHED_LIMIT:
                    h.finished.clear()
                    h.full = False
            else:
                h.open[ex.execution_id] = (seqs[ex.execution_id], ex)
        for sandbox_id in dict.fromkeys(e.sandbox_id for e in events):
            h = self._held.pop(sandbox_id, None)
            if h is not None and not (h.sandbox is not None and h.sandbox.status.is_final):
                self._held[sandbox_id] = h  # last in the order: written most recently (ended: not kept)
        while len(self._held) > LIMIT:
            del self._held[next(iter(self._held))]
