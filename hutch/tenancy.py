"""Organizations, projects, API keys and quotas: ``client.tenancy`` (async), and the same
methods blocking on ``SyncSandboxClient.tenancy``.

Which organization a call acts in is the key's own, or ``SandboxClient(org_id=…)`` for the
server's administrator (the bootstrap key), who may act for any organization.
"""

from __future__ import annotations

from typing import Any

from hutch._connection import Connection, segment

# The shapes are the server's too (core/wire.py); this module is the calls that answer them.
from hutch.core.wire import ApiKey, Organization, Project, Quota, SshKey
from hutch.models import from_wire

__all__ = ["ApiKey", "Organization", "Project", "Quota", "SshKey", "Tenancy"]


class Tenancy:
    """``client.tenancy``: the calls of the tenancy routes, over the client's connection."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection

    async def _call(self, method: str, path: str, body: Any = None) -> Any:
        return self._connection.data(await self._connection.request(method, path, json=body))

    async def create_org(self, name: str) -> Organization:
        """A new organization (the server's administrator only); its id is ``org_<name>``."""
        return from_wire(Organization, await self._call("POST", "/orgs", {"name": name}))

    async def list_orgs(self) -> list[Organization]:
        return [from_wire(Organization, o) for o in (await self._call("GET", "/orgs"))["orgs"]]

    async def get_org(self, org_id: str) -> Organization:
        """The organization with its quota and current usage."""
        return from_wire(Organization, await self._call("GET", f"/orgs/{segment(org_id)}"))

    async def set_quota(self, org_id: str, **limits: int | None) -> Organization:
        """``sandboxes=``, ``memory_bytes=``, ``cpu_millis=``, ``snapshot_bytes=``; None lifts one."""
        names = {"sandboxes": "sandboxes", "memory_bytes": "memoryBytes", "cpu_millis": "cpuMillis",
                 "snapshot_bytes": "snapshotBytes"}
        body = {names.get(k, k): v for k, v in limits.items()}
        return from_wire(Organization, await self._call("PATCH", f"/orgs/{segment(org_id)}/quota", body))

    async def create_project(self, name: str) -> Project:
        return from_wire(Project, await self._call("POST", "/projects", {"name": name}))

    async def list_projects(self) -> list[Project]:
        return [from_wire(Project, p) for p in (await self._call("GET", "/projects"))["projects"]]

    async def create_key(self, role: str, *, name: str | None = None, projects: list[str] | None = None,
                         expires: str | None = None, rate: float | None = None,
                         burst: int | None = None) -> ApiKey:
        """A new key; its ``secret`` is in this answer only. ``expires``: ``30d``, ``12h`` or an
        ISO-8601 time; ``projects``: ids or names the key is limited to."""
        body = {"role": role, "name": name, "projects": projects or [], "expires": expires, "rate": rate,
                "burst": burst}
        return from_wire(ApiKey, await self._call("POST", "/keys", {k: v for k, v in body.items() if v is not None}))

    async def list_keys(self) -> list[ApiKey]:
        return [from_wire(ApiKey, k) for k in (await self._call("GET", "/keys"))["keys"]]

    async def revoke_key(self, key_id: str) -> ApiKey:
        return from_wire(ApiKey, await self._call("DELETE", f"/keys/{segment(key_id)}"))

    async def add_ssh_key(self, public_key: str, *, name: str | None = None) -> SshKey:
        """Register an OpenSSH public key line (``~/.ssh/id_ed25519.pub``) for the gateway: it
        opens this organization's sandboxes with a member's rights."""
        body = {"publicKey": public_key, **({"name": name} if name else {})}
        return from_wire(SshKey, await self._call("POST", "/ssh-keys", body))

    async def list_ssh_keys(self) -> list[SshKey]:
        return [from_wire(SshKey, k) for k in (await self._call("GET", "/ssh-keys"))["sshKeys"]]

    async def remove_ssh_key(self, ssh_key_id: str) -> SshKey:
        return from_wire(SshKey, await self._call("DELETE", f"/ssh-keys/{segment(ssh_key_id)}"))
