"""What crosses the Driver port (``drivers/roles.py``): the requests a driver is given, what
it answers, the capability flags, and the objects it hands back (a running terminal, an
output sink it writes to).

Pure values, so the service and the API can name them without importing a driver; the
drivers' own face, ``drivers/base.py``, re-exports them under their old import path.
"""

from __future__ import annotations

import abc
import os
import re
from collections.abc import AsyncIterable, Awaitable, Callable, Mapping, Sequence
from typing import Literal, Protocol

import attrs

from hutch.core.errors import InvalidInput
from hutch.core.models import SandboxSpec

Stream = Literal["stdout", "stderr"]


@attrs.frozen
class Capabilities:
    """What a driver can do here, now: the run-time truth the service checks before it asks.

    An optional role's flag (files, watches, metadata, tar_streams, checkpoints, pause, terminals, ports) is set
    only by a driver that plays the role (drivers/roles.py), and may stay unset although it
    does, where the host lacks something (the local driver cannot pause without a cgroup
    freezer); the other flags qualify the required roles."""

    memory_limit: bool = False
    cpu_limit: bool = False
    pids_limit: bool = False
    network: bool = False  # can give a sandbox outbound network when asked
    pause: bool = False
    # pause freezes running commands too, their time limits standing still (drivers/runclock.py:
    # the local driver's, the node driver's agents', the nomad driver's); without it a pause
    # with commands running is refused (NotSupported, naming the driver).
    pause_running: bool = False
    # pause(memory=False): every process ended and its memory released, its files kept; the
    # resume boots it again over them (a fresh boot id). E2B's filesystem-only pause.
    pause_filesystem: bool = False
    files: bool = False
    checkpoints: bool = False
    ports: bool = False  # can expose one port of a sandbox to the server (port_target)
    installs: bool = False  # can add apt dependencies and npm packages at create (prepare)
    tar_streams: bool = False  # export_tar/import_tar: whole trees in one go (archives, snapshots)
    kernel_isolation: bool = False  # real namespaces; False for the fake driver
    egress_allow: bool = False  # can limit an enabled network to network.allow's destinations
    egress_deny: bool = False  # can keep an enabled network from network.deny's destinations
    network_update: bool = False  # update_network: a live sandbox's egress rules replaced (NetworkRules)
    terminals: bool = False  # open_terminal: a command on a pseudo-terminal (service/terminals.py)
    named_user: bool = False  # can run a sandbox as an account of another name (ProvisionRequest.user)
    watches: bool = False  # watch_dir: a directory's changes as the kernel reports them
    metadata: bool = False  # set_metadata: a file's user.e2b.* extended attributes, listed with it


# Processes per sandbox when a create gives none: a fork bomb stops there (and each driver's
# pids guard ends it), not at the host's pid_max.
# HUTCH_DEFAULT_PIDS is checked by the server's Config at start (service/config.py), which names
# a bad value; read here too because drivers also run without a Config (tests, tools).
def _default_pids() -> int:
    text = os.environ.get("HUTCH_DEFAULT_PIDS", "")
    return int(text) if text.isdigit() and int(text) > 0 else 1024


DEFAULT_PIDS = _default_pids()


def check_env(env: Mapping[str, str], field: str) -> None:
    """What a process environment can hold: names without '=' or NUL, values without NUL."""
    for key, value in env.items():
        if not key or "=" in key or "\0" in key or "\0" in value:
            raise InvalidInput(f"invalid environment variable name or value: {key!r}", field=field)


# A user name the sandbox's /etc/passwd can carry: no ':' or newline can reach that file.
_USER_NAME = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
DEFAULT_USER = "agentuity"


def check_user(name: str | None, field: str = "user") -> str:
    """The sandbox account's name (``None``: the default); raises naming a bad one."""
    if name is None:
        return DEFAULT_USER
    if not isinstance(name, str) or not _USER_NAME.fullmatch(name) or name == "root":
        raise InvalidInput(f"{field}: expected a user name (lowercase letters, digits, _ and -, at most 32, "
                           f"not root), got {name!r}", field=field)
    return name


def home_of(user: str | None) -> str:
    return f"/home/{check_user(user)}"


@attrs.frozen
class ResourceLimits:
    memory_bytes: int | None = None
    cpu_millis: int | None = None
    disk_bytes: int | None = None
    pids: int | None = None


@attrs.frozen
class ProvisionRequest:
    sandbox_id: str
    runtime: str  # catalog name, e.g. "python:3.13"; the driver maps it to its image
    resources: ResourceLimits = ResourceLimits()
    network_enabled: bool = False
    port: int | None = None  # one port to expose (through port_target); None = none
    network_allow: tuple[str, ...] = ()  # core/egress.py entries; () = unrestricted
    network_deny: tuple[str, ...] = ()  # IPv4 CIDRs it may not reach (core/egress.parse_deny)
    env: Mapping[str, str] = attrs.field(factory=dict)
    dependencies: tuple[str, ...] = ()  # apt packages to add to the runtime (checked: core.packages)
    packages: tuple[str, ...] = ()  # npm packages to install globally
    user: str | None = None  # the sandbox account's name, home /home/<user> (None: agentuity)
    # The organization it belongs to: the local driver bounds each one's pids together (a
    # request from an older server, without one: the default organization's).
    org_id: str = "org_local"

    @classmethod
    def for_spec(cls, sandbox_id: str, spec: SandboxSpec) -> ProvisionRequest:
        """What the driver needs of a sandbox's spec. The env travels with every exec instead
        (it can change: PATCH /sandbox/env), so a removed variable is really gone."""
        r = spec.resources
        return cls(sandbox_id=sandbox_id, runtime=spec.runtime,
                   resources=ResourceLimits(memory_bytes=r.memory_bytes, cpu_millis=r.cpu_millis, disk_bytes=r.disk_bytes),
                   network_enabled=spec.network.enabled, port=spec.network.port, env={},
                   network_allow=spec.network.allow, network_deny=spec.network.deny,
                   dependencies=spec.dependencies, packages=spec.packages, user=spec.user, org_id=spec.org_id)


@attrs.frozen
class ExecRequest:
    execution_id: str
    sandbox_id: str
    argv: Sequence[str]
    env: Mapping[str, str] = attrs.field(factory=dict)  # merged over the sandbox env
    cwd: str | None = None  # None = the sandbox workspace (HOME)
    timeout: float | None = None  # seconds; None = no limit
    stdin: bytes | AsyncIterable[bytes] | None = None  # streamed when an iterable: flat memory


@attrs.frozen
class ExecResult:
    exit_code: int  # 128+n when killed by signal n
    timed_out: bool = False
    cancelled: bool = False
    oom_killed: bool = False


@attrs.frozen
class FileWrite:
    path: str  # relative paths resolve to the sandbox workspace
    content: bytes
    mode: int = 0o644


@attrs.frozen
class FileInfo:
    name: str  # the entry's name in the listed directory (a listed file: its base name)
    size: int
    is_dir: bool
    mode: int  # permission bits and type bits, as st_mode
    mod_time: float  # unix seconds
    is_symlink: bool = False
    link_target: str | None = None
    owner: str = ""  # user and group names as the sandbox's /etc/passwd and /etc/group say (else the id)
    group: str = ""
    metadata: dict[str, str] = attrs.field(factory=dict)  # its user.e2b.* extended attributes (FileMetadata)


@attrs.frozen
class WatchEvent:
    kind: Literal["create", "write", "remove", "rename", "chmod"]
    name: str  # relative to the watched directory ("" for the directory itself)


class WatchEnded(Exception):
    """A directory watch is over: closed, its directory gone, or its sandbox ended."""


class DirWatch(abc.ABC):
    """A directory watched inside a sandbox, until closed (or its directory or sandbox goes).
    One consumer at a time: either ``flush`` (polling) or ``next`` (a stream)."""

    @abc.abstractmethod
    async def flush(self) -> list[WatchEvent]:
        """Every event of a change made before this call not yet taken, without waiting for
        more. Raises WatchEnded once the watch is over and every event was taken."""

    @abc.abstractmethod
    async def next(self) -> list[WatchEvent]:
        """The next events, waiting for some. Raises WatchEnded as ``flush`` does."""

    @property
    @abc.abstractmethod
    def ended(self) -> bool: ...

    @abc.abstractmethod
    async def close(self) -> None: ...


@attrs.frozen
class Usage:
    cpu_seconds: float | None = None  # CPU time of every process the sandbox ran
    memory_peak_bytes: int | None = None  # the most memory it held at once
    # Now, for E2B's metrics (api/e2b/metrics.py); None where the driver cannot know.
    memory_bytes: int | None = None  # held now, page cache included
    memory_cache_bytes: int | None = None  # of which page cache
    memory_total_bytes: int | None = None  # the most it may hold: its limit, or the machine's memory
    cpu_count: int | None = None  # CPUs it may use: its limit rounded up, or the machine's
    disk_used_bytes: int | None = None  # what its writable layer holds
    disk_total_bytes: int | None = None  # the file system that layer is on: its disk limit, or the host's


@attrs.frozen
class NodeInfo:
    """One machine of a driver that places sandboxes on several (the node driver), as the
    operator sees it (``hutch node list``)."""

    name: str
    state: str  # "up", "unreachable" (not answering yet) or "lost" (its sandboxes failed)
    draining: bool = False  # takes no new sandbox
    sandboxes: int = 0
    cpus: int = 0
    memory_total: int = 0
    memory_available: int = 0
    memory_committed: int = 0
    cpu_committed_millis: int = 0
    reason: str | None = None  # why it is not up


@attrs.frozen
class Metric:
    """One sample for ``GET /metrics`` (Prometheus text format)."""

    name: str  # hutch_…
    value: float
    kind: Literal["gauge", "counter"] = "gauge"
    help: str = ""
    labels: Mapping[str, str] = attrs.field(factory=dict)


class OutputSink(Protocol):
    """Where a running command's bytes go. Called from the event loop."""

    def write(self, stream: Stream, data: bytes) -> None: ...


@attrs.frozen
class TerminalRequest:
    sandbox_id: str
    argv: Sequence[str]  # what runs on the terminal (a login shell when the user names none)
    env: Mapping[str, str] = attrs.field(factory=dict)  # merged over the sandbox env, as an exec's
    cwd: str | None = None  # None = the sandbox workspace (HOME)
    rows: int = 24
    cols: int = 80


class PtySession(abc.ABC):
    """A command running on a pseudo-terminal in a sandbox, as the sandbox user with the
    sandbox's limits and seccomp filter, the same as an execution. The terminal's line
    discipline does the rest: a Ctrl-C written as the byte 0x03 signals the foreground
    process group, not the session."""

    @abc.abstractmethod
    async def read(self) -> bytes:
        """The next output (what the terminal echoes included); b"" once no process holds
        the terminal any more."""

    @abc.abstractmethod
    async def write(self, data: bytes) -> None:
        """Typed input, as a keyboard sends it."""

    @abc.abstractmethod
    async def resize(self, rows: int, cols: int) -> None:
        """The window size; the foreground process gets SIGWINCH."""

    @abc.abstractmethod
    async def wait(self) -> int:
        """The command's exit code (128+n when killed by signal n)."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Hang up: the session gets SIGHUP and what it started is killed. Idempotent."""


# The engine's callback for a sandbox that ended on its own: (sandbox id, reason, failed).
SandboxEndedListener = Callable[[str, str, bool], Awaitable[None]]

