"""Fixtures of the system tests: real server processes on the shared Kafka broker and
PostgreSQL server, each test on its own topics and database, dropped afterwards."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator

import pytest

from tests.services import drop_database, drop_topics, fresh_database, kafka_url


def _label(request: pytest.FixtureRequest) -> str:
    """The test module's name (test_poison -> poison): which suite left a database, if any is left."""
    return request.module.__name__.rsplit(".", 1)[-1].removeprefix("test_")


@pytest.fixture
def kafka_log() -> Iterator[Callable[[str], str]]:
    """Fresh topics on the shared broker, deleted afterwards."""
    made: list[str] = []

    def make(label: str) -> str:
        made.append(kafka_url(label))
        return made[-1]

    yield make
    for url in made:
        asyncio.run(drop_topics(url))


@pytest.fixture
def database(request: pytest.FixtureRequest) -> Iterator[str]:
    url, name = asyncio.run(fresh_database(_label(request)))
    yield url
    asyncio.run(drop_database(name))


@pytest.fixture
def shared(request: pytest.FixtureRequest, database: str) -> Iterator[Callable[[], dict[str, str]]]:
    """One Kafka topic and one PostgreSQL database for every server of the test."""
    log = kafka_url(_label(request))
    yield lambda: {"HUTCH_EVENT_LOG": log, "HUTCH_STORE": database}
    asyncio.run(drop_topics(log))
