"""The production services the tests use, as started by ``./scripts/services start kafka postgres``
(``scripts/test`` does that and exports the settings it prints).

A test that needs a service and does not find it fails its setup: nothing here skips.
Each test gets its own Kafka topic and its own PostgreSQL database, so tests never see each
other's events or rows.
"""

from __future__ import annotations

import os
import urllib.parse
import uuid

import pytest

_HOW = "start it with: set -a; eval \"$(./scripts/services start kafka postgres)\"; set +a  (scripts/test does this)"


def _setting(*names: str) -> str:
    for name in names:
        value = os.environ.get(name)
        if value:
            return value
    pytest.fail(f"{' / '.join(names)} is not set: the test needs the real service; {_HOW}", pytrace=False)


def kafka_url(label: str = "t") -> str:
    """A kafka:// event-log URL with a fresh topic on the test broker."""
    base = _setting("HUTCH_TEST_EVENT_LOG", "HUTCH_EVENT_LOG")
    if not base.startswith("kafka://"):
        pytest.fail(f"HUTCH_TEST_EVENT_LOG/HUTCH_EVENT_LOG={base!r} is not a kafka:// URL; {_HOW}", pytrace=False)
    parts = urllib.parse.urlsplit(base)
    return f"kafka://{parts.netloc}/hutch-test-{label}-{uuid.uuid4().hex[:12]}"


def postgres_admin_url() -> str:
    url = _setting("HUTCH_TEST_STORE", "HUTCH_STORE")
    if not url.startswith(("postgresql://", "postgres://")):
        pytest.fail(f"HUTCH_TEST_STORE/HUTCH_STORE={url!r} is not a postgresql:// URL; {_HOW}", pytrace=False)
    return url


async def fresh_database(label: str = "t") -> tuple[str, str]:
    """Create an empty database on the test server; returns (its URL, its name)."""
    import asyncpg

    admin = postgres_admin_url()
    name = f"hutch_test_{label}_{uuid.uuid4().hex[:12]}"
    try:
        conn = await asyncpg.connect(admin)
    except (OSError, asyncpg.PostgresError) as err:
        pytest.fail(f"cannot connect to PostgreSQL at {admin}: {err}; {_HOW}", pytrace=False)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    parts = urllib.parse.urlsplit(admin)
    return urllib.parse.urlunsplit(parts._replace(path="/" + name)), name


async def drop_database(name: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(postgres_admin_url())
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()
