"""The agent's settings, checked at start: a bad one stops it with one line naming it."""

from __future__ import annotations

import os
from pathlib import Path

import attrs

from hutch.core.errors import InvalidInput
from hutch.core.quantities import parse_bytes
from hutch.core.waiting import HEAD_SECONDS, read_settings
from hutch.drivers.local import pidstotal
from hutch.drivers.node import placement, wire


class SettingError(Exception):
    """A setting the agent cannot start with; its message is the one line an operator sees."""


@attrs.frozen
class NodeSettings:
    name: str
    host: str
    port: int
    data_dir: Path
    runtime_cache: Path
    secret: bytes = attrs.field(repr=False)
    max_sandboxes: int = placement.MAX_SANDBOXES
    memory_limit: int | None = None  # the memory limits it takes in all; None: 32x its memory (core/capacity.py)
    pids_total: int | None = None  # the pids its sandboxes hold together; None: pid_max less a reserve
    org_pids: int | None = None  # the pids each organization's hold together; None: half of pids_total
    # HUTCH_REQUEST_HEAD_SECONDS and HUTCH_MAX_WAITING_CONNECTIONS, as on hutch serve
    # (edge/listener.py): None, a share of the open-file limit.
    head_seconds: float = HEAD_SECONDS
    max_waiting: int | None = None


def read_secret(env: dict[str, str] | None = None) -> bytes:
    """The cluster's node secret, from ``HUTCH_NODE_SECRET_FILE`` or ``HUTCH_NODE_SECRET``."""
    env = dict(os.environ) if env is None else env
    path = env.get("HUTCH_NODE_SECRET_FILE")
    if path:
        try:
            secret = Path(path).read_bytes().strip()
        except OSError as err:
            raise SettingError(f"HUTCH_NODE_SECRET_FILE: cannot read {path}: {err.strerror}") from None
        where = "HUTCH_NODE_SECRET_FILE"
    elif env.get("HUTCH_NODE_SECRET"):
        secret, where = env["HUTCH_NODE_SECRET"].encode(), "HUTCH_NODE_SECRET"
    else:
        raise SettingError("no node secret: set HUTCH_NODE_SECRET_FILE (or HUTCH_NODE_SECRET) to the cluster's "
                           f"shared secret of at least {wire.MIN_SECRET} bytes")
    try:
        return wire.check_secret(secret, where)
    except ValueError as err:
        raise SettingError(str(err)) from None


def parse_listen(text: str, field: str = "--listen") -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise SettingError(f"{field}: expected HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


def settings(name: str, listen: str, data_dir: str, env: dict[str, str] | None = None) -> NodeSettings:
    env = dict(os.environ) if env is None else env
    if not name or not all(c.isalnum() or c in "-_." for c in name):
        raise SettingError(f"--name: letters, digits, '-', '_' and '.' only, got {name!r}")
    if os.geteuid() != 0:
        raise SettingError("hutch node serve needs root: an agent makes sandboxes with cgroups, overlays and a "
                           "uid range (run it as root, as the cluster's system job does)")
    host, port = parse_listen(listen)
    cache = Path(env.get("HUTCH_RUNTIME_CACHE") or env.get("HUTCH_RUNTIMES_DIR") or "/var/cache/hutch/runtimes")
    # The server-wide name (a local driver's host) too: a node agent's host is one like it.
    setting = next((n for n in ("HUTCH_NODE_MAX_SANDBOXES", "HUTCH_MAX_SANDBOXES") if env.get(n)),
                   "HUTCH_NODE_MAX_SANDBOXES")
    most = env.get(setting) or str(placement.MAX_SANDBOXES)
    if not most.isdigit() or int(most) < 1:
        raise SettingError(f"{setting}: expected a positive whole number, got {most!r}")
    try:
        head_seconds, max_waiting = read_settings(env)
    except ValueError as err:
        raise SettingError(str(err)) from None
    return NodeSettings(name=name, host=host, port=port, data_dir=Path(data_dir), runtime_cache=cache,
                        secret=read_secret(env), max_sandboxes=int(most), memory_limit=memory_limit(env),
                        pids_total=pids_total(env), org_pids=org_pids(env), head_seconds=head_seconds,
                        max_waiting=max_waiting)


def memory_limit(env: dict[str, str]) -> int | None:
    """``HUTCH_MEMORY_COMMIT_LIMIT``, as a server's local driver reads it: the memory limits
    the host takes in all (at least 16Mi); unset, None."""
    text = env.get("HUTCH_MEMORY_COMMIT_LIMIT")
    if not text:
        return None
    try:
        limit = parse_bytes("HUTCH_MEMORY_COMMIT_LIMIT", text)
    except InvalidInput as err:
        raise SettingError(err.message) from None
    if limit < 16 << 20:
        raise SettingError(f"HUTCH_MEMORY_COMMIT_LIMIT: expected at least 16Mi, got {text!r}")
    return limit


def pids_total(env: dict[str, str]) -> int | None:
    """``HUTCH_SANDBOX_PIDS_TOTAL``, as a server's local driver reads it (drivers/local/pidstotal.py)."""
    text = env.get(pidstotal.SETTING)
    if not text:
        return None
    try:
        return pidstotal.parse(text)
    except ValueError as err:
        raise SettingError(str(err)) from None


def org_pids(env: dict[str, str]) -> int | None:
    """``HUTCH_ORG_PIDS``, as a server's local driver reads it (drivers/local/pidstotal.py)."""
    text = env.get(pidstotal.ORG_SETTING)
    if not text:
        return None
    total = pids_total(env)
    try:
        org = pidstotal.parse_org(text)
        pidstotal.check_share(org, pidstotal.default() if total is None else total)
    except ValueError as err:
        raise SettingError(str(err)) from None
    return org
