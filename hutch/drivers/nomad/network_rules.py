"""The nomad driver's egress rules (a mixin of :class:`drivers.nomad.driver.NomadDriver`): a
sandbox's allow-list kept current as its names resolve anew (``drivers.egress.AllowLists``),
and its rules replaced whole (``update_network``), both through the plugin's verbs
(containerd-driver/egress.go) and kept in the sandbox's state file.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from hutch.core.egress import ALL_TRAFFIC
from hutch.core.errors import DriverFailure, NotSupported
from hutch.drivers.egress import AllowLists, flatten, resolve
from hutch.drivers.nomad.client import ExecFailed, NomadClient
from hutch.drivers.nomad.execs import plugin_verb
from hutch.drivers.nomad.jobs import TASK
from hutch.drivers.nomad.state import NomadSandbox, StateFiles

EXIT_NO_OUTBOUND = 3  # the plugin's egress verb: the task has no outbound network (egress.go)


class NomadNetworkRules:
    _client: NomadClient
    _allow: AllowLists
    _states: StateFiles

    if TYPE_CHECKING:  # provided by NomadDriver; a stub here would shadow it in the MRO
        def running(self, sid: str) -> NomadSandbox: ...
        def _lock(self, sid: str) -> asyncio.Lock: ...
        async def _verb(self, sb: NomadSandbox, verb: dict[str, Any]) -> None: ...

    async def _apply_allow(self, sid: str, resolved: dict[str, list[str]]) -> None:
        """A refreshed allow-list (AllowLists): the plugin replaces the task's chain."""
        async with self._lock(sid):
            sb = self.running(sid)
            if set(resolved) != set(sb.allow):
                return  # its list was replaced (update_network) while these names resolved
            await self._verb(sb, {"allow": flatten(resolved)})
            sb.allow = resolved
            await asyncio.to_thread(self._states.save, sb)

    async def update_network(self, sandbox_id: str, *, enabled: bool, allow: tuple[str, ...],
                             deny: tuple[str, ...]) -> None:
        """The sandbox's rules replaced whole by the plugin's egress verb: its chain swapped in
        one commit under a new generation, so connections opened under the old rules are judged
        anew (containerd-driver/egress.go), and kept on the client for a plugin restart. Only a
        sandbox made with outbound network has a chain: one made without keeps none (off is
        what it has already); the plugin says which it is."""
        resolved = await resolve(allow) if allow else {}  # first: a name that does not resolve changes nothing
        async with self._lock(sandbox_id):
            sb = self.running(sandbox_id)
            listed = {e: sorted(c) for e, c in resolved.items()}
            rules = {"allow": flatten(listed) if listed else None, "deny": list(deny) if enabled else [ALL_TRAFFIC]}
            try:
                code, out = await plugin_verb(self._client, sb.alloc_id, TASK, {"egress": rules})
            except ExecFailed as err:
                if "empty command" not in str(err):
                    raise
                raise DriverFailure(f"sandbox {sandbox_id}: its client's hutch-containerd plugin predates "
                                    "update_network (no egress verb); restart that client's Nomad") from err
            if code == EXIT_NO_OUTBOUND:
                if enabled:
                    raise NotSupported(f"network: sandbox {sandbox_id} was made without outbound network, and an "
                                       "update cannot give it one; create it with network enabled", field="network")
                return
            if code != 0:
                raise DriverFailure(f"sandbox {sandbox_id}: replacing its egress rules failed (exit {code}): "
                                    f"{out[:300]!r}")
            sb.allow = listed  # kept only once in force: a failed swap leaves the old rules, and the record
            await asyncio.to_thread(self._states.save, sb)
            if listed:
                self._allow.replace(sandbox_id, resolved)
            else:
                self._allow.forget(sandbox_id)
