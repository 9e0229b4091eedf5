"""A live sandbox's egress rules replaced (E2B's update_network; ``PUT /sandbox/{id}/network``):
checked against what the driver can keep, applied by it whole, then recorded as a ``network``
event, so the log, the API and the driver agree on the rules a sandbox runs under."""

from __future__ import annotations

from hutch.core.errors import NotSupported
from hutch.core.lifecycle import ChangeNetwork
from hutch.core.models import SandboxState
from hutch.drivers import egress
from hutch.drivers.base import Capabilities
from hutch.drivers.roles import NetworkRules, SandboxLifecycle
from hutch.service.reads import Reads
from hutch.service.recorder import Recorder


class EgressRules:
    def __init__(self, reads: Reads, recorder: Recorder, *, lifecycle: SandboxLifecycle, network: NetworkRules) -> None:
        self._reads = reads
        self._recorder = recorder
        self._lifecycle = lifecycle
        self._network = network

    @property
    def _caps(self) -> Capabilities:
        return self._lifecycle.capabilities

    async def update(self, sandbox_id: str, *, enabled: bool, allow: tuple[str, ...] = (),
                     deny: tuple[str, ...] = ()) -> SandboxState:
        """Replace the sandbox's rules. The sandbox is looked up first (another organization's
        is not found), then what the driver cannot keep is refused naming the field, host names
        are resolved (a 400 naming one that does not), and only then the driver swaps the rules;
        the event is appended once it did."""
        await self._reads.require(sandbox_id, include_deleted=False)
        name = self._lifecycle.name
        if not self._caps.network_update:
            raise NotSupported(f"network: driver {name} cannot change a running sandbox's egress rules",
                               field="network")
        for field, asked, can, what in (("network.allow", allow, self._caps.egress_allow, "limit a network to destinations"),
                                        ("network.deny", deny, self._caps.egress_deny, "keep a network from destinations")):
            if asked and not can:
                raise NotSupported(f"{field}: driver {name} cannot {what}", field=field)
        if allow:
            await egress.resolve(allow)
        command = ChangeNetwork(enabled=enabled, allow=allow, deny=deny)
        await self._recorder.act(sandbox_id, lambda _sb: command, lambda c: self._network.update_network(
            sandbox_id, enabled=c.enabled, allow=c.allow, deny=c.deny))
        return await self._reads.require(sandbox_id)
