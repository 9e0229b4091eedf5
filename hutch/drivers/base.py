"""The Driver seam: make a sandbox real on some machine and run commands in it.

Shaped after Nomad's driver plugin: small interfaces by role (``drivers/roles.py``),
capability flags telling the layer above what a backend cannot do here, and ``NotSupported``
for what it does not offer. ``Driver`` is the whole port, as one class; ``DriverRoles`` the
same driver seen by role, which is how the service takes it. The values that cross the port
live in ``core/driver_types.py`` and are named here too. Every driver passes the same
conformance suite (``tests/contracts/test_driver.py``).
"""

from __future__ import annotations

import attrs

from hutch.core.driver_types import (
    DEFAULT_PIDS,
    Capabilities,
    ExecRequest,
    ExecResult,
    FileInfo,
    FileWrite,
    Metric,
    OutputSink,
    ProvisionRequest,
    PtySession,
    ResourceLimits,
    SandboxEndedListener,
    Stream,
    TerminalRequest,
    Usage,
    WatchEnded,
    check_env,
)
from hutch.drivers.roles import (
    OPTIONAL_ROLES,
    Adoption,
    Checkpointing,
    CommandRunner,
    DirectoryWatching,
    FileMetadata,
    NetworkRules,
    NodeFleet,
    NotPlayed,
    Pausing,
    PortForwarding,
    RuntimeCatalog,
    SandboxFiles,
    SandboxLifecycle,
    Terminals,
    TreeTransfer,
    UsageReporting,
)


class Driver(SandboxLifecycle, RuntimeCatalog, CommandRunner, NotPlayed):
    """The whole port: the three required roles, and for every optional role what a driver
    that does not play it answers (``NotPlayed``), so code typed on ``Driver`` sees every
    method of every role, as before the port was split.

    A driver subclasses it and lists the optional roles it plays first, which makes their
    methods abstract again for it: ``class LocalDriver(roles.SandboxFiles, …, Driver)``."""


class _RolesNotPlayed(NotPlayed, SandboxFiles, DirectoryWatching, FileMetadata, TreeTransfer, Checkpointing, Pausing,
                      Terminals, PortForwarding, NetworkRules, UsageReporting, Adoption, NodeFleet):
    """Stands in for the optional roles a driver does not play, answering in its name."""

    def __init__(self, name: str) -> None:
        self.name = name


@attrs.frozen
class DriverRoles:
    """A driver by role: each field is the driver where it plays that role, else a stand-in
    answering as ``NotPlayed`` does. The service's collaborators take the roles they use from
    it (service/engine.py); the archive streams (service/archives.py) take it whole, since they
    choose between ``trees`` and ``files`` by capability."""

    lifecycle: SandboxLifecycle
    runtimes: RuntimeCatalog
    commands: CommandRunner
    files: SandboxFiles
    watches: DirectoryWatching
    metadata: FileMetadata
    trees: TreeTransfer
    checkpointing: Checkpointing
    pausing: Pausing
    terminals: Terminals
    ports: PortForwarding
    network: NetworkRules
    usage: UsageReporting
    adoption: Adoption
    fleet: NodeFleet

    @property
    def name(self) -> str:
        return self.lifecycle.name

    @property
    def capabilities(self) -> Capabilities:
        return self.lifecycle.capabilities

    @classmethod
    def of(cls, driver: Driver) -> DriverRoles:
        for role in OPTIONAL_ROLES:
            _check_listed(driver, role)
        absent = _RolesNotPlayed(driver.name)
        d = driver
        return cls(lifecycle=d, runtimes=d, commands=d,
                   files=d if isinstance(d, SandboxFiles) else absent,
                   watches=d if isinstance(d, DirectoryWatching) else absent,
                   metadata=d if isinstance(d, FileMetadata) else absent,
                   trees=d if isinstance(d, TreeTransfer) else absent,
                   checkpointing=d if isinstance(d, Checkpointing) else absent,
                   pausing=d if isinstance(d, Pausing) else absent,
                   terminals=d if isinstance(d, Terminals) else absent,
                   ports=d if isinstance(d, PortForwarding) else absent,
                   network=d if isinstance(d, NetworkRules) else absent,
                   usage=d if isinstance(d, UsageReporting) else absent,
                   adoption=d if isinstance(d, Adoption) else absent,
                   fleet=d if isinstance(d, NodeFleet) else absent)


def _check_listed(driver: Driver, role: type) -> None:
    """A driver written against the one wide Driver overrides the methods it offers without
    listing their role; taken as not played, they would answer NotSupported in silence. Said
    when the engine is built (DriverRoles.of) instead."""
    if isinstance(driver, role):
        return
    stray = [name for name, value in vars(role).items()
             if callable(value) and not name.startswith("_") and getattr(type(driver), name) is not getattr(NotPlayed, name)]
    if stray:
        raise TypeError(f"{type(driver).__name__} defines {', '.join(stray)} of {role.__name__} "
                        f"but does not list {role.__name__} among its bases")


__all__ = [
    "DEFAULT_PIDS",
    "Capabilities",
    "Driver",
    "DriverRoles",
    "ExecRequest",
    "ExecResult",
    "FileInfo",
    "FileWrite",
    "Metric",
    "OutputSink",
    "ProvisionRequest",
    "PtySession",
    "ResourceLimits",
    "SandboxEndedListener",
    "Stream",
    "TerminalRequest",
    "Usage",
    "WatchEnded",
    "check_env",
]
