"""Nothing a test made outlives it.

A sandbox outlives the server that made it on purpose (a restarted server adopts it: the
recovery tests rely on that), so a test that stops its server without destroying what it made
leaves sandbox processes running on the machine, and a reused CI machine piles them up.
Tests that start their own ``hutch serve`` call ``destroy_every_sandbox`` before stopping it.
"""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from typing import Any


def destroy_every_sandbox(url: str, key: str, timeout: float = 120) -> None:
    """Destroy every live sandbox of every organization the key sees (the bootstrap key sees
    all of them). A refused destroy fails the test that made it."""
    for org in _call(url, key, "GET", "/orgs", timeout)["orgs"]:
        query = urllib.parse.urlencode({"orgId": org["id"], "live": "true", "limit": 100})
        for sb in _call(url, key, "GET", f"/sandbox?{query}", timeout)["sandboxes"]:
            _call(url, key, "DELETE", f"/sandbox/{sb['sandboxId']}?orgId={urllib.parse.quote(org['id'])}", timeout)


def _call(url: str, key: str, method: str, path: str, timeout: float) -> Any:
    req = urllib.request.Request(url + path, method=method, headers={"Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:  # an HTTP error raises: loud
        return json.loads(resp.read() or b"{}").get("data")
