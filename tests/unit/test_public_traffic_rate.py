"""Anonymous traffic to a public port of an E2B sandbox (``allowPublicTraffic``) was throttled
in the bucket of the key that made the sandbox: anyone who found the port could spend that
key's whole rate, and its owner's own API calls were answered 429. Such traffic now has a
bucket of its own, at the key's rate: a stranger's requests slow only the public ports."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from hutch.api.e2b.access import SANDBOX_HEADER, wire_id
from hutch.api.e2b.public import HOST_ROUTED, PUBLIC_KEY, traffic_principal
from hutch.api.keys import ENGINE, TENANTS
from hutch.core import ids
from hutch.core.errors import RateLimited
from hutch.service.tenancy import Tenants, bootstrap_key_id

SECRET = "hk_test_public_traffic_bootstrap_secret"


def _app(tenants: Tenants, sandbox_id: str) -> web.Application:
    sb = SimpleNamespace(sandbox_id=sandbox_id, api_key_id=bootstrap_key_id(SECRET),
                         spec=SimpleNamespace(metadata={PUBLIC_KEY: True}, org_id=tenants.bootstrap.org_id))

    async def sandbox(wanted: str) -> Any:
        return sb if wanted == sandbox_id else None

    app = web.Application()
    app[ENGINE] = SimpleNamespace(reads=SimpleNamespace(sandbox=sandbox))  # type: ignore[assignment]
    app[TENANTS] = tenants
    return app


async def test_strangers_on_a_public_port_do_not_spend_the_keys_own_rate() -> None:
    tenants = Tenants(SECRET, default_rate=(1.0, 5))
    sandbox_id = ids.new_id("sandbox")
    app = _app(tenants, sandbox_id)
    refused = None
    for _ in range(50):  # a stranger's requests to the port, far past the burst
        request = make_mocked_request("GET", "/", headers={SANDBOX_HEADER: wire_id(sandbox_id)}, app=app)
        request[HOST_ROUTED] = 8000
        try:
            await traffic_principal(request, 8000)
        except RateLimited as err:
            refused = err
            break
    assert refused is not None, "public traffic is not rate limited at all"
    assert "public traffic" in refused.message, refused.message
    assert tenants.bootstrap.key_id not in refused.message, refused.message  # a stranger learns no key id
    tenants.throttle(tenants.bootstrap)  # the owner's own API call: its bucket is untouched


def test_the_public_bucket_is_the_keys_rate_and_its_own() -> None:
    tenants = Tenants(SECRET, default_rate=(1.0, 2))
    for _ in range(2):
        tenants.throttle(tenants.bootstrap, public=True)
    with pytest.raises(RateLimited, match="public traffic to this sandbox's ports"):
        tenants.throttle(tenants.bootstrap, public=True)
    for _ in range(2):
        tenants.throttle(tenants.bootstrap)
    with pytest.raises(RateLimited, match=r"rate limit: key \S+ may make 1 requests"):
        tenants.throttle(tenants.bootstrap)
