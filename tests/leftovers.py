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


def destroy_every_sandbox(url: str, key: str, timeout: float = 120) -> list[str]:
    """Destroy every live sandbox of every organization the key sees (the bootstrap key sees
    all of them); the ids destroyed. A refused destroy fails the test that made it."""
    destroyed: list[str] = []
    for org in _get(url, key, "/orgs", timeout)["orgs"]:
        query = urllib.parse.urlencode({"orgId": org["id"], "live": "true", "limit": 100})
        for sb in _get(url, key, f"/sandbox?{query}", timeout)["sandboxes"]:
            sid = sb["sandboxId"]
            _call(url, key, "DELETE", f"/sandbox/{sid}?orgId={urllib.parse.quote(org['id'])}", timeout)
            destroyed.append(sid)
    return destroyed


def _get(url: str, key: str, path: str, timeout: float) -> Any:
    return _call(url, key, "GET", path, timeout)


def _call(url: str, key: str, method: str, path: str, timeout: float) -> Any:
    req = urllib.request.Request(url + path, method=method, headers={"Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:  # an HTTP error raises: loud
        return json.loads(resp.read() or b"{}").get("data")
