"""The Nomad job a sandbox runs as: one task group, one task of the hutch-containerd plugin
(its config is the plugin's TaskConfig: scripts/services.d/nomad/containerd-driver)."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

import attrs

from hutch.core.egress import DENY_SETTING, PERMIT_SETTING, denied_ranges
from hutch.core.errors import InvalidInput
from hutch.core.quantities import parse_bytes, parse_millicores
from hutch.drivers.base import DEFAULT_PIDS, ResourceLimits
from hutch.drivers.local import network as sandbox_network
from hutch.drivers.nomad import images

PLUGIN = "hutch-containerd"
TASK = "sandbox"
# An allocation alive or about to be: a client tells the servers "running" up to a second
# after it starts the task (placement.py), so one just placed still reads "pending".
LIVE = ("pending", "running")
HOME = images.HOME
PORT_LABEL = "sandbox"  # the group network's dynamic port carrying network.port
# pid 1: an idle shell that reaps orphaned children and exits at once on SIGTERM; not
# dumpable (images.INIT_SHELL), so out of reach of ptrace from inside.
INIT = [images.INIT_SHELL, "-c", "trap 'exit 0' TERM; while :; do sleep 86400 & wait $!; done"]
# What a sandbox that asks for nothing gets: what service/quotas.py counts it at (512Mi, one CPU),
# or the service's HUTCH_DEFAULT_MEMORY / HUTCH_DEFAULT_CPU. Never unlimited.
DEFAULT_MEMORY = "512Mi"
DEFAULT_CPU = "1000m"
CPU_RESERVATION_MHZ = 10
DISCONNECT_LOST_AFTER_NS = 3600 * 10**9  # unknown -> lost after an hour (the job is long stopped)


def default_resources() -> ResourceLimits:
    """The memory and CPU of a sandbox that gives none; InvalidInput names a bad setting."""
    memory = os.environ.get("HUTCH_DEFAULT_MEMORY") or DEFAULT_MEMORY
    cpu = os.environ.get("HUTCH_DEFAULT_CPU") or DEFAULT_CPU
    return ResourceLimits(memory_bytes=parse_bytes("HUTCH_DEFAULT_MEMORY", memory),
                     cpu_millis=parse_millicores("HUTCH_DEFAULT_CPU", cpu))


def sized(resources: ResourceLimits) -> ResourceLimits:
    """``resources`` with the defaults where it names no memory or CPU."""
    defaults = default_resources()
    return attrs.evolve(resources, memory_bytes=resources.memory_bytes or defaults.memory_bytes,
                        cpu_millis=resources.cpu_millis or defaults.cpu_millis)


def egress_denied() -> list[str]:
    """The IPv4 ranges sandboxes with a network are refused (core/egress.py), from the operator's
    HUTCH_SANDBOX_EGRESS_PERMIT / HUTCH_SANDBOX_EGRESS_DENY; InvalidInput names a bad one."""
    try:
        return denied_ranges(os.environ.get(PERMIT_SETTING, ""), os.environ.get(DENY_SETTING, ""))
    except ValueError as err:
        setting = DENY_SETTING if str(err).startswith(DENY_SETTING) else PERMIT_SETTING
        raise InvalidInput(str(err), field=setting) from None


def job_spec(job_id: str, image: str, datacenters: list[str], resources: ResourceLimits, meta: dict[str, str], *,
             network: bool = False, port: int | None = None, allow: list[str] | None = None,
             deny: Sequence[str] = (), denied: Sequence[str] = ()) -> dict[str, Any]:
    """The Nomad job of one sandbox (or pool entry): one group, one hutch-containerd task.
    ``deny``: the sandbox's network.deny; ``denied``: what every sandbox with network may not
    reach (egress_denied())."""
    resources = sized(resources)
    assert resources.memory_bytes and resources.cpu_millis
    memory_mb = max(16, math.ceil(resources.memory_bytes / 2**20))
    config: dict[str, Any] = {
        "image": image,
        "command": INIT[0],
        "args": INIT[1:],
        "uid": images.SANDBOX_UID,
        "workspace": HOME,
        "hostname": "sandbox",
        "pids_limit": resources.pids or DEFAULT_PIDS,
        "cpu_millis": resources.cpu_millis,
    }
    if resources.disk_bytes:  # the plugin's own file system of that size (disk.go)
        config["disk_bytes"] = resources.disk_bytes
    group_extra: dict[str, Any] = {}
    if network or port is not None:
        # Nomad's bridge (CNI); the plugin keeps sandboxes off the host and each other.
        net: dict[str, Any] = {"Mode": "bridge"}
        if port is not None:  # Nomad maps a host port to it (CNI portmap): port_target
            net["DynamicPorts"] = [{"Label": PORT_LABEL, "To": port}]
        group_extra["Networks"] = [net]
        config["resolv_conf"] = sandbox_network.resolv_conf()
        config["no_outbound"] = not network  # a port alone serves; it reaches nothing
        config["denied"] = list(denied or egress_denied())  # the plugin's egress.go
        if allow is not None:
            config["allow"] = allow
        if deny:  # only then: a client whose plugin predates network.deny still takes the rest
            config["deny"] = list(deny)
    return {"Job": {
        "ID": job_id, "Name": job_id, "Type": "service", "Datacenters": datacenters,
        "Meta": meta,
        "TaskGroups": [{
            "Name": TASK, "Count": 1,
            "RestartPolicy": {"Attempts": 0, "Mode": "fail", "Interval": 86400 * 10**9, "Delay": 10**9},
            "ReschedulePolicy": {"Attempts": 0, "Unlimited": False},
            # A sandbox whose node stops answering is over (its state is there): its allocation
            # turns "unknown", the driver fails the sandbox and stops the job, and nothing is
            # placed elsewhere in its stead (a lost allocation of a service job would be
            # replaced whatever the reschedule policy says). Should the node come back, the
            # stopped job tells it to kill what it still runs.
            "Disconnect": {"LostAfter": DISCONNECT_LOST_AFTER_NS, "Replace": False},
            "EphemeralDisk": {"SizeMB": 10},
            "Update": {"MaxParallel": 0},
            **group_extra,
            "Tasks": [{
                "Name": TASK, "Driver": PLUGIN, "Config": config,
                "Resources": {"CPU": CPU_RESERVATION_MHZ, "MemoryMB": memory_mb},
                "KillTimeout": 2 * 10**9,
                "LogConfig": {"MaxFiles": 1, "MaxFileSizeMB": 1},
            }],
        }],
    }}
