"""One ``hutch serve`` (local driver, E2B wire on) per module, and the E2B SDK pointed at it
by its two environment variables, as a user would."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.services import drop_database, drop_topics, fresh_database, kafka_url
from tests.system.server import KEY, Server, free_port


class E2bServer:
    def __init__(self, server: Server, e2b_port: int, tls_port: int, data: Path) -> None:
        self.server = server
        self.url = f"http://127.0.0.1:{e2b_port}"
        # E2B's host routing over TLS (api/e2b/hosts.py): the SDK's E2B_DOMAIN, and the CA to trust
        self.domain = f"e2b.localhost:{tls_port}"
        self.ca_file = data / "e2b-tls" / "ca.pem"

    def domain_env(self) -> dict[str, str]:
        """The environment of an SDK that finds this server as E2B's cloud is found: by its
        domain alone (control plane at api.{domain}, sandboxes at {port}-{id}.{domain})."""
        return {"E2B_DOMAIN": self.domain, "E2B_API_KEY": KEY, "SSL_CERT_FILE": str(self.ca_file)}

    def key_of_new_org(self, name: str) -> str:
        """An admin key of a new organization ``name`` (made by the bootstrap key)."""
        org = self.server.data("POST", "/orgs", {"name": name})
        return str(self.server.data("POST", f"/keys?orgId={org['id']}", {"role": "admin"})["secret"])

    def call(self, method: str, path: str, body: Any = None, key: str = KEY) -> tuple[int, Any]:
        """A raw call of the E2B control API: (status, JSON answer), errors included."""
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"X-API-Key": key, "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                raw = resp.read()
                return resp.status, json.loads(raw) if raw else None
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read())


def _serve(tmp_path_factory: pytest.TempPathFactory, driver: str = "local", **env: str) -> Iterator[E2bServer]:
    data: Path = tmp_path_factory.mktemp("e2b") / "data"
    data.mkdir()
    e2b_port, tls_port = free_port(), free_port()
    server = Server(data, driver=driver, HUTCH_E2B_PORT=str(e2b_port), HUTCH_E2B_TLS_PORT=str(tls_port), **env).start()
    try:
        yield E2bServer(server, e2b_port, tls_port, data)
    finally:
        server.destroy_every_sandbox()
        server.stop()


def _serve_production(tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2bServer]:
    """Kafka and PostgreSQL, a fresh topic and database; a missing service fails loudly."""
    log = kafka_url("e2b")
    store, name = asyncio.run(fresh_database("e2b"))
    try:
        yield from _serve(tmp_path_factory, HUTCH_EVENT_LOG=log, HUTCH_STORE=store)
    finally:
        asyncio.run(drop_database(name))
        asyncio.run(drop_topics(log))


@pytest.fixture(scope="module")
def e2b_embedded_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2bServer]:
    """The embedded profile (SQLite log, memory store): E2B's own sync tests run here."""
    yield from _serve(tmp_path_factory)


@pytest.fixture(scope="module")
def e2b_production_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2bServer]:
    """The production profile: E2B's own async tests (the sync ones' twins) run here."""
    yield from _serve_production(tmp_path_factory)


@pytest.fixture(scope="module", params=["embedded", "production"])
def e2b_server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2bServer]:
    """hutch's own E2B tests run on both profiles with the local driver. The E2B wire
    reaches drivers only through the engine, as the Agentuity wire does, whose suites already
    run every driver: a third server here proved nothing new for the suite's time."""
    yield from (_serve(tmp_path_factory) if request.param == "embedded" else _serve_production(tmp_path_factory))


@pytest.fixture(scope="module")
def e2b_env(e2b_server: E2bServer) -> Iterator[E2bServer]:
    """E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY set for the module's tests."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("E2B_API_URL", e2b_server.url)
        mp.setenv("E2B_SANDBOX_URL", e2b_server.url)
        mp.setenv("E2B_API_KEY", KEY)
        mp.delenv("E2B_DEBUG", raising=False)
        mp.delenv("E2B_DOMAIN", raising=False)
        yield e2b_server


# E2B's own tests run in their own pytest (tests/e2b/test_upstream.py), under their own
# pytest.ini and conftest: not collected as hutch's.
collect_ignore = ["upstream"]
