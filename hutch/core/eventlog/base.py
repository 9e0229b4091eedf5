"""The EventLog port: an ordered, durable, append-only log of events.

Positions are positive integers assigned by the log, strictly increasing in append
order; position 0 means "before the first event". Every backend passes
``tests/contracts/test_eventlog.py``. The backends themselves do I/O, so they live outside
``core``, in the top-level ``eventlog`` package; ``api.composition`` picks one.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Sequence
from typing import ClassVar, Protocol

import attrs

from hutch.core.errors import NotSupported
from hutch.core.events import Encoded, Event


@attrs.frozen
class LogCapabilities:
    """What a backend can do beyond the port's required methods (Nomad-driver style: callers
    check these flags, never the backend's type). Each backend declares exactly what it
    implements; ``tests/contracts/test_eventlog.py`` holds it to that."""

    # Consumer groups: several processes share the log's partitions, each resuming where its
    # group left off (``hutch audit`` on Kafka). Without them a reader follows ``subscribe``.
    consumer_groups: bool = False


class GroupMember(Protocol):
    """What one member of a consumer group does with its share of the log
    (``EventLog.consume_group``). ``source`` names what the offsets count in (the topic)."""

    async def resume_points(self, source: str, partitions: Sequence[int]) -> dict[int, int]:
        """Per partition, the offset below which the member holds every record already (0: none)."""
        ...

    async def deliver(self, source: str, records: Sequence[tuple[int, int, Event]]) -> None:
        """(partition, offset, event) records of one partition, in order. The group's progress
        is committed once this returns."""
        ...

    def mark_caught_up(self) -> None:
        """The member has read every partition it holds up to its end."""
        ...


class EventLog(abc.ABC):
    capabilities: ClassVar[LogCapabilities] = LogCapabilities()

    async def start(self) -> None:  # noqa: B027 - optional hook
        """Open connections; called once before use."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Flush and release everything."""

    @abc.abstractmethod
    async def append(self, events: Sequence[Event | Encoded]) -> list[int]:
        """Append atomically and durably; returns the positions given, in order.

        Returning means the events survive a kill -9 or power loss of this process. An
        ``Encoded`` event is written as its ``record`` (the recorder's, checked already);
        a bare ``Event`` is encoded by the log.
        """

    @abc.abstractmethod
    async def read(
        self,
        after: int = 0,
        *,
        sandbox_id: str | None = None,
        limit: int | None = None,
        reverse: bool = False,
    ) -> list[Event]:
        """Events with position > ``after`` (or, reversed, < ``after`` when after > 0),
        optionally for one sandbox, oldest first unless ``reverse``."""

    @abc.abstractmethod
    async def last_position(self) -> int:
        """Position of the newest event, 0 when empty."""

    @abc.abstractmethod
    def subscribe(self, after: int = 0) -> AsyncIterator[Event]:
        """Every event after ``after``, then new ones as they are appended, forever."""

    @abc.abstractmethod
    async def identity(self) -> str | None:
        """What tells this log from every other one: fixed when the log is made, kept for its
        whole life, different for a new, recreated or replaced log. A projection store records
        the identity of the log it folds (see ``projections.runner``). None while a reader
        sees a log that has none yet (an empty Kafka topic)."""

    async def consume_group(self, group: str, member: GroupMember) -> None:
        """Follow the log, forever, as a member of consumer group ``group``: the members share
        the partitions, and each resumes where ``member`` or the group left off
        (``capabilities.consumer_groups``)."""
        raise NotSupported(f"event log {type(self).__name__} has no consumer groups")
