"""What a sandbox gets when its create asks for no resources: one set of numbers, filled into
its spec by the service before the create is recorded, so the driver enforces, the quota
counts and the event log records the same values.

Why these defaults (HUTCH_DEFAULT_MEMORY, HUTCH_DEFAULT_CPU): 512Mi and one core are what
quotas always counted an unsized sandbox as; a Python or Node process with a few packages
fits, and a 24 GiB, 2-core host still runs dozens of them. A sandbox that needs more asks.
"""

from __future__ import annotations

import attrs

from hutch.core.models import ResourceSpec, SandboxSpec
from hutch.core.quantities import parse_bytes, parse_millicores


@attrs.frozen
class SandboxDefaults:
    memory: str = "512Mi"
    cpu: str = "1"
    disk: str | None = None  # None: no disk limit unless asked (a limit costs a loop file system)

    @property
    def memory_bytes(self) -> int:
        return parse_bytes("HUTCH_DEFAULT_MEMORY", self.memory)

    @property
    def cpu_millis(self) -> int:
        return parse_millicores("HUTCH_DEFAULT_CPU", self.cpu)

    def apply(self, spec: SandboxSpec, *, cpu_limit: bool = True) -> SandboxSpec:
        """``spec`` with every resource it left out set to its default. ``cpu_limit``: whether
        the driver can limit CPU (a rootless server cannot: it refuses a given one by name, and
        is not handed a default it would have to refuse)."""
        r = spec.resources
        filled = attrs.evolve(
            r,
            memory=r.memory if r.memory_bytes is not None else self.memory,
            memory_bytes=r.memory_bytes if r.memory_bytes is not None else self.memory_bytes,
            cpu=r.cpu if r.cpu_millis is not None or not cpu_limit else self.cpu,
            cpu_millis=r.cpu_millis if r.cpu_millis is not None or not cpu_limit else self.cpu_millis,
            disk=r.disk if r.disk_bytes is not None else self.disk,
            disk_bytes=r.disk_bytes if r.disk_bytes is not None or self.disk is None
            else parse_bytes("HUTCH_DEFAULT_DISK", self.disk),
        )
        return spec if filled == r else attrs.evolve(spec, resources=filled)

    def memory_of(self, resources: ResourceSpec) -> int:
        """What a sandbox counts against a memory quota (one recorded before defaults were filled
        in counts the default)."""
        return resources.memory_bytes or self.memory_bytes

    def cpu_of(self, resources: ResourceSpec) -> int:
        return resources.cpu_millis or self.cpu_millis
