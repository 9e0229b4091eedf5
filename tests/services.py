"""The production services the tests use, as started by ``./scripts/services start kafka postgres``
(``scripts/test`` does that and exports the settings it prints).

A test that needs a service and does not find it fails its setup: nothing here skips.
Each test gets its own Kafka topic and its own PostgreSQL database, so tests never see each
other's events or rows.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import tempfile
import urllib.parse
import uuid
from pathlib import Path

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


async def drop_topics(url: str) -> None:
    """Delete the topics of a kafka:// event log made by ``kafka_url`` (the broker outlives runs)."""
    from aiokafka.admin import AIOKafkaAdminClient

    parts = urllib.parse.urlsplit(url)
    topic = parts.path.strip("/")
    admin = AIOKafkaAdminClient(bootstrap_servers=parts.netloc)
    await admin.start()
    try:
        with contextlib.suppress(Exception):  # best effort: a leftover topic only costs disk
            await admin.delete_topics([topic, f"{topic}.order", f"{topic}.indexed"])
    finally:
        await admin.close()


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
        # FORCE ends our own leftover sessions, but an autovacuum worker (a superuser process)
        # that happens to be on the database cannot be ended by the non-superuser test role:
        # it finishes within moments, so try again briefly.
        for attempt in range(40):
            try:
                await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                return
            except (asyncpg.InsufficientPrivilegeError, asyncpg.ObjectInUseError):
                if attempt == 39:
                    raise
                await asyncio.sleep(0.25)
    finally:
        await conn.close()


ROOT = Path(__file__).resolve().parents[1]


class PrivateService:
    """A service of this test's own (another port, fresh state under /var/lib/hutch/test-services:
    PostgreSQL's own user must be able to reach it), for fault tests that restart or kill it
    without disturbing the shared one. Started and stopped with the same scripts users run."""

    def __init__(self, name: str, port: int) -> None:
        self.name = name
        base = Path("/var/lib/hutch/test-services")
        base.mkdir(parents=True, exist_ok=True)
        base.chmod(0o755)
        self.state = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=base))
        self.state.chmod(0o755)
        port_var = {"kafka": "HUTCH_KAFKA_PORT", "postgres": "HUTCH_PG_PORT"}[name]
        self.env = {**os.environ, port_var: str(port), "HUTCH_SERVICES_DIR": str(self.state)}
        self.settings: dict[str, str] = {}

    def _run(self, action: str, **env: str) -> str:
        proc = subprocess.run(
            [str(ROOT / "scripts" / "services.d" / f"{self.name}.sh"), action],
            env={**self.env, **env}, capture_output=True, text=True, timeout=180,
        )
        if proc.returncode != 0:
            pytest.fail(f"{self.name}.sh {action} failed ({proc.returncode}):\n{proc.stderr[-3000:]}", pytrace=False)
        return proc.stdout

    def start(self) -> PrivateService:
        for line in self._run("start").splitlines():
            key, _, value = line.partition("=")
            if value:
                self.settings[key] = value
        return self

    def stop(self, **env: str) -> None:
        self._run("stop", **env)

    def pid(self) -> int:
        return int(self._run("pid").strip())

    def destroy(self) -> None:
        try:
            self.stop()
        finally:
            shutil.rmtree(self.state, ignore_errors=True)
