"""First use of a runtime with the real builders: the nomad driver pushes the runtime's image
to a registry namespace that has never seen it, and Nomad pulls it, through the HTTP API, as a
user's first create would go (see test_first_use.py for the engine's side on both profiles).
The local driver's first build (mmdebstrap into an empty cache) is proven once, with the real
Agentuity client driving it: tests/compat/test_agentuity_client.py."""

from __future__ import annotations

import time
import uuid

import pytest

from tests.api.conftest import AppFactory
from tests.drivers_support import NOMAD_REGISTRY, RUNTIME_CACHE, require_root


@pytest.fixture
def profile() -> dict[str, str]:
    return {}  # the engine's side runs on both profiles in test_first_use.py


@pytest.fixture
def driver_name() -> str:
    return "local"


async def first_use(make_api: AppFactory, **config: object) -> dict[str, float]:
    api = await make_api(**config)
    started = time.monotonic()
    created = await api.data("POST", "/sandbox", expect=201, json={
        "runtime": "base:latest", "command": {"exec": ["sh", "-c", "cat /etc/debian_version; id -un"],
                                              "mode": "oneshot"}})
    assert created["status"] == "creating"
    out = (await api.stream(created["stdoutStreamUrl"])).decode()
    took = time.monotonic() - started
    done = await api.wait_execution(created["executionId"])
    assert (done["status"], done["exitCode"]) == ("completed", 0), done
    assert out.split()[1] == "agentuity" and out.split()[0][0].isdigit(), out
    events = (await api.data("GET", f"/sandbox/sandboxes/{created['sandboxId']}/events?limit=100"))["events"]
    progress = [e["event"]["message"] for e in events if e["type"] == "runtime:build"]
    assert progress, [e["type"] for e in events]
    listed = {r["name"]: r for r in (await api.data("GET", "/sandbox/runtimes"))["runtimes"]}
    base = listed["base:latest"]
    assert base["available"] is True and base["sizeBytes"] > 50 * 2**20 and base["builtAt"].endswith("Z"), base
    # The second use is an ordinary create.
    started = time.monotonic()
    again = await api.data("POST", "/sandbox", expect=201, json={
        "runtime": "base:latest", "command": {"exec": ["true"], "mode": "oneshot"}})
    assert again["status"] != "creating"
    await api.wait_execution(again["executionId"])
    return {"first": took, "second": time.monotonic() - started, "steps": len(progress)}


async def test_the_nomad_driver_pushes_a_runtime_image_at_its_first_use(make_api: AppFactory) -> None:
    require_root()
    # A registry namespace no image was ever pushed to: the push and Nomad's pull happen here.
    registry = f"{NOMAD_REGISTRY}/first-use-{uuid.uuid4().hex[:8]}"
    figures = await first_use(make_api, driver="nomad", runtime_cache=RUNTIME_CACHE, nomad_registry=registry)
    print(f"nomad first use of base:latest (image push + pull): {figures}")
