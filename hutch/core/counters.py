"""Process-wide counts of the log path's own work: appends, Produce requests, projector
batches, store statements. Plain ints bumped inline, shown on GET /metrics.

Counts, not timings, on purpose: the cost of a run in appends, round trips and statements is
the same on an idle machine and a loaded one, where CPU readings are not (bench/oneshot_cpu.py
divides their deltas by the runs it made). One registry per process: a server runs one
engine; a test that shares a process with others reads deltas.
"""

from __future__ import annotations

from collections import Counter

Labels = tuple[tuple[str, str], ...]

HELP: dict[str, str] = {
    "hutch_eventlog_appends_total": "appends to the event log (each awaited by its caller)",
    "hutch_eventlog_append_events_total": "events in those appends",
    "hutch_eventlog_writes_total": "writes that carried appends to the log (a Kafka Produce, a SQLite transaction)",
    "hutch_eventlog_write_events_total": "events in those writes",
    "hutch_eventlog_acked_handed_events_total": "events a Kafka subscriber had from this process's acknowledged "
                                                "appends, without waiting for a Fetch to bring them back",
    "hutch_eventlog_index_copies_total": "Kafka transactions that copied the order topic into the keyed topic",
    "hutch_eventlog_index_copy_events_total": "events in those copies",
    "hutch_projector_batches_total": "batches the projector applied to the projection store",
    "hutch_projector_events_total": "events in those batches",
    "hutch_store_statements_total": "statements sent to PostgreSQL, by pool (store) and kind (first keyword and table)",
}

_counts: Counter[tuple[str, Labels]] = Counter()


def count(name: str, n: int = 1, labels: Labels = ()) -> None:
    _counts[(name, labels)] += n


def counts() -> list[tuple[str, dict[str, str], int]]:
    """Every counter so far: name, labels, value."""
    return [(name, dict(labels), value) for (name, labels), value in sorted(_counts.items())]
