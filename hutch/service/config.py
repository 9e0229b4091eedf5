"""Server configuration: flags win over HUTCH_* environment variables, which win over defaults.

Every setting is converted to its type and checked when a ``Config`` is made, so a server
refuses a bad setting at start, in one line naming it (``HUTCH_PORT: expected a port
number (0-65535), got 'eighty'``), instead of failing later or with a traceback.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import re
import secrets
import socket
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from hutch.core import capacity
from hutch.core.errors import InvalidInput
from hutch.core.paths import API_KEY_FILE, default_data_dir
from hutch.core.waiting import default_waiting
from hutch.edge.out_of_files import open_file_limit

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8700
MIN_MEMORY = 16 * 2**20  # the least a sandbox starts with (api/parse.py refuses less at create)
EVENT_LOGS = "sqlite, sqlite:///PATH or kafka://HOST:PORT/TOPIC"


def _refuse(setting: str, expected: str, value: object) -> InvalidInput:
    return InvalidInput(f"{setting}: expected {expected}, got {value!r}", field=setting)


def _setting(env: str, default: Any, *, check: Callable[[str, Any], None] | None = None,
             convert: Callable[[str, Any], Any] | None = None) -> Any:
    """A field set by ``env`` (or a flag): ``convert`` turns text into the field's type and
    ``check`` refuses a bad value; both raise an ``InvalidInput`` naming ``env``."""
    return attrs.field(
        default=default,
        converter=None if convert is None else (lambda value: convert(env, value)),
        validator=None if check is None else (lambda _inst, _attr, value: check(env, value)),
        metadata={"env": env},
    )


# ---------------------------------------------------------------- converters


def _to_port(setting: str, value: object) -> int | None:
    if value is None:
        return None
    try:
        port = int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        port = -1
    if isinstance(value, bool) or not 0 <= port <= 65535:
        raise _refuse(setting, "a port number (0-65535)", value)
    return port


def _to_count(setting: str, value: object) -> int:
    try:
        count = int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        count = 0
    if isinstance(value, bool) or count < 1:
        raise _refuse(setting, "a positive whole number", value)
    return count


def _to_pids_total(setting: str, value: object) -> int | None:
    if value is None or value == "":
        return None
    from hutch.drivers.local.pidstotal import parse  # light: no driver is started

    try:
        return parse(value)
    except ValueError as err:
        raise InvalidInput(str(err), field=setting) from None


def _to_org_pids(setting: str, value: object) -> int | None:
    if value is None or value == "":
        return None
    from hutch.drivers.local.pidstotal import parse_org

    try:
        return parse_org(value)
    except ValueError as err:
        raise InvalidInput(str(err), field=setting) from None


def _to_optional_count(setting: str, value: object) -> int | None:
    return None if value is None or value == "" else _to_count(setting, value)


def _to_seconds(setting: str, value: object) -> float:
    try:
        seconds = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        seconds = 0.0
    if isinstance(value, bool) or not 0 < seconds < math.inf:
        raise _refuse(setting, "a number of seconds above 0", value)
    return seconds


def _to_path(_setting: str, value: object) -> Path | None:
    return None if value is None else Path(value)  # type: ignore[arg-type]


# ---------------------------------------------------------------- checks


def _one_of(*choices: str) -> Callable[[str, str], None]:
    def check(setting: str, value: str) -> None:
        if value not in choices:
            raise _refuse(setting, ", ".join(choices[:-1]) + " or " + choices[-1], value)

    return check


def _check_host(setting: str, value: str) -> None:
    if not value or "://" in value or any(c.isspace() or c == "/" for c in value):
        raise _refuse(setting, "a host name or IP address", value)


def _check_host_port(setting: str, value: str | None) -> None:
    """``host`` or ``host:port`` (a domain, a registry): no scheme, no path."""
    if value is None:
        return
    host, sep, port = value.rpartition(":") if ":" in value else (value, "", "")
    if not host or "://" in value or any(c.isspace() or c == "/" for c in value) or \
            (sep and not (port.isdigit() and int(port) <= 65535)):
        raise _refuse(setting, "HOST or HOST:PORT", value)


def _check_e2b_domain(setting: str, value: str) -> None:
    """A DNS name of two labels at least (a certificate's ``*.`` covers no single-label
    parent), no port: the TLS listener's port is its own setting."""
    labels = value.split(".")
    if len(labels) < 2 or not all(re.fullmatch(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?", label) for label in labels):
        raise _refuse(setting, "a lowercase DNS name of two labels at least, such as e2b.localhost", value)


def _check_registry(setting: str, value: str) -> None:
    """Where images are pulled from: ``host[:port][/prefix]``, no scheme."""
    if not value or "://" in value or any(c.isspace() for c in value):
        raise _refuse(setting, "HOST:PORT of a container registry (no scheme)", value)


def _check_http_url(setting: str, value: str | None) -> None:
    if value is None:
        return
    parts = urllib.parse.urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise _refuse(setting, "an http:// or https:// URL", value)


def _check_replica_id(setting: str, value: str | None) -> None:
    if value is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", value):
        raise _refuse(setting, "1-64 letters, digits, '_', '.' or '-'", value)


def _check_event_log(setting: str, value: str) -> None:
    if value in ("sqlite", "embedded", ""):
        return
    if value.startswith("sqlite://"):
        if not value.removeprefix("sqlite://"):
            raise _refuse(setting, f"{EVENT_LOGS} (with a path)", value)
        return
    parts = urllib.parse.urlsplit(value)
    topic = parts.path.strip("/")
    if parts.scheme != "kafka" or not parts.netloc or not topic or "/" in topic:
        raise _refuse(setting, EVENT_LOGS, value)


def _check_store(setting: str, value: str) -> None:
    if value not in ("memory", "") and not value.startswith(("postgresql://", "postgres://")):
        raise _refuse(setting, "memory or postgresql://USER@HOST:PORT/DATABASE", value)


def _check_secret(setting: str, value: str | None) -> None:
    if value and any(c.isspace() for c in value):  # "" counts as unset, as in the environment
        # Never echo a secret, not even a bad one.
        raise InvalidInput(f"{setting}: expected a secret without spaces", field=setting)


def _check_node_agents(setting: str, value: str | None) -> None:
    if value is not None:
        from hutch.drivers.node.directory import parse_agents  # an InvalidInput naming the entry

        parse_agents(value, setting)


_NOMAD_SERVICE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?")  # Nomad's own rule (RFC 1123)
_NOMAD_NAMESPACE = re.compile(r"[A-Za-z0-9-]{1,128}")


def _check_nomad_service(setting: str, value: str) -> None:
    if not _NOMAD_SERVICE.fullmatch(value):
        raise _refuse(setting, "a Nomad service name (letters, digits and dashes, at most 63)", value)


def _check_nomad_namespace(setting: str, value: str) -> None:
    if not _NOMAD_NAMESPACE.fullmatch(value):
        raise _refuse(setting, "a Nomad namespace (letters, digits and dashes, at most 128)", value)


def _check_node_secret(setting: str, value: str | None) -> None:
    _check_secret(setting, value)
    if value and len(value.encode()) < 32:
        raise InvalidInput(f"{setting}: the node secret must be at least 32 bytes", field=setting)


def _check_log_level(setting: str, value: str) -> None:
    if value not in logging.getLevelNamesMapping():
        raise _refuse(setting, "DEBUG, INFO, WARNING, ERROR or CRITICAL", value)


def _check_pool(setting: str, value: str) -> None:
    from hutch.drivers.nomad.pools import pool_sizing_from_env  # its own messages name the setting

    if setting == "HUTCH_NOMAD_POOL":
        pool_sizing_from_env(value)
    else:
        pool_sizing_from_env("off", value)


def _check_exec_mode(setting: str, value: str) -> None:
    from hutch.drivers.nomad.exec_modes import check_mode  # light: no python-nomad needed

    check_mode(setting, value)


def _check_prebuild(setting: str, value: str) -> None:
    _prebuild_names(value)


def _check_size(setting: str, value: str | None) -> None:
    from hutch.core.quantities import parse_bytes

    if value is not None:
        parse_bytes(setting, value)  # an InvalidInput naming it


def _check_duration(setting: str, value: str) -> None:
    from hutch.core.quantities import parse_duration

    parse_duration(setting, value)  # an InvalidInput naming it


def _check_memory(setting: str, value: str) -> None:
    from hutch.core.quantities import parse_bytes

    if parse_bytes(setting, value) < MIN_MEMORY:  # parse_bytes: an InvalidInput naming it
        raise _refuse(setting, f"at least {MIN_MEMORY >> 20}Mi (a sandbox needs that much to start)", value)


def _check_memory_limit(setting: str, value: str | None) -> None:
    if value is not None:
        _check_memory(setting, value)


def _check_cpu(setting: str, value: str) -> None:
    from hutch.core.quantities import parse_millicores

    parse_millicores(setting, value)  # an InvalidInput naming it


def _check_ca_certs(setting: str, value: str | None) -> None:
    if value:
        from hutch.drivers.trust import read_certs  # light: no driver is started

        try:
            read_certs(value)
        except ValueError as err:
            raise InvalidInput(str(err), field=setting) from None


def _check_egress(setting: str, value: str) -> None:
    from hutch.core import egress

    try:
        egress.denied_ranges(**{"permit" if setting == egress.PERMIT_SETTING else "deny": value})
    except ValueError as err:  # its words name the setting
        raise InvalidInput(str(err), field=setting) from None


def _check_rate(setting: str, value: str) -> None:
    from hutch.service.tenancy import parse_rate

    parse_rate(value, setting)  # an InvalidInput naming it


@attrs.frozen
class Config:
    data_dir: Path = attrs.field(factory=default_data_dir, converter=Path, metadata={"env": "HUTCH_DATA_DIR"})
    host: str = _setting("HUTCH_HOST", DEFAULT_HOST, check=_check_host)
    port: int = _setting("HUTCH_PORT", DEFAULT_PORT, convert=_to_port)
    # "sqlite" (default: <data_dir>/events.db) or a URL: sqlite:///path, kafka://host:port/topic
    event_log: str = _setting("HUTCH_EVENT_LOG", "sqlite", check=_check_event_log)
    # "memory" (default) or postgresql://...
    store: str = _setting("HUTCH_STORE", "memory", check=_check_store)
    # "inprocess" (default): this server applies the log to the store. "external": a separate
    # `hutch projector` does (PostgreSQL only); this server waits for it (read-your-writes).
    projector: str = _setting("HUTCH_PROJECTOR", "inprocess", check=_one_of("inprocess", "external"))
    driver: str = _setting("HUTCH_DRIVER", "local", check=_one_of("local", "nomad", "node", "fake"))
    # None: read or generate <data_dir>/api-key
    api_key: str | None = _setting("HUTCH_API_KEY", None, check=_check_secret)
    # base for absolute stream URLs; default http://host:port
    public_url: str | None = _setting("HUTCH_PUBLIC_URL", None, check=_check_http_url)
    # Set in code only (no variable): per stream and execution, then outputTruncated; JSON
    # bodies (base64 file writes included); one archive upload, streamed to disk.
    output_cap_bytes: int = _setting("output_cap_bytes", 16 * 2**20, convert=_to_count)
    max_body_bytes: int = _setting("max_body_bytes", 64 * 2**20, convert=_to_count)
    max_upload_bytes: int = _setting("max_upload_bytes", 4 * 2**30, convert=_to_count)
    max_archive_entries: int = _setting("max_archive_entries", 100_000, convert=_to_count)
    # where built runtimes live
    runtime_cache: Path | None = _setting("HUTCH_RUNTIME_CACHE", None, convert=_to_path)  # noqa: RUF009
    # The nomad driver (scripts/services start nomad prints these):
    nomad_addr: str = _setting("HUTCH_NOMAD_ADDR", "http://127.0.0.1:4646", check=_check_http_url)
    nomad_token: str | None = _setting("HUTCH_NOMAD_TOKEN", None, check=_check_secret)  # ACL token
    # where the runtime images are
    nomad_registry: str = _setting("HUTCH_NOMAD_REGISTRY", "127.0.0.1:5000", check=_check_registry)
    # Warm pools: "auto" (adaptive, drivers/nomad/pools.py), "off", or fixed sizes
    # "base:latest=2,python:3.13=1"; HUTCH_NOMAD_POOL_MEMORY: their MiB per client node.
    nomad_pool: str = _setting("HUTCH_NOMAD_POOL", "auto", check=_check_pool)
    nomad_pool_memory: str = _setting("HUTCH_NOMAD_POOL_MEMORY", "", check=_check_pool)
    # How commands run: "agent" (a per-sandbox exec agent forks them, drivers/nomad/agents.py)
    # or "alloc" (each its own Nomad alloc exec: a runc exec, ~45 ms more).
    nomad_exec: str = _setting("HUTCH_NOMAD_EXEC", "agent", check=_check_exec_mode)
    # The node driver (docs/node.md): the agents, a static name=host:port,… or else the Nomad
    # service the hutch-node system job registers in its namespace (read with HUTCH_NOMAD_ADDR
    # and HUTCH_NOMAD_TOKEN), and the cluster's shared secret (>= 32 bytes; the file wins).
    node_agents: str | None = _setting("HUTCH_NODE_AGENTS", None, check=_check_node_agents)
    node_service: str = _setting("HUTCH_NODE_SERVICE", "hutch-node", check=_check_nomad_service)
    node_namespace: str = _setting("HUTCH_NODE_NAMESPACE", "hutch-system", check=_check_nomad_namespace)
    node_secret: str | None = _setting("HUTCH_NODE_SECRET", None, check=_check_node_secret)
    node_secret_file: Path | None = _setting("HUTCH_NODE_SECRET_FILE", None, convert=_to_path)  # noqa: RUF009
    # Catalog runtimes to build at start ("all", or names, comma-separated); any other
    # runtime is built at its first use.
    prebuild: str = _setting("HUTCH_PREBUILD", "", check=_check_prebuild)
    # A wildcard domain pointing at this server ("sandboxes.example.com", with a ":port" when
    # not on 80/443): port URLs become {port}-{id}.{domain} (api/routes/proxy.py).
    sandbox_domain: str | None = _setting("HUTCH_SANDBOX_DOMAIN", None, check=_check_host_port)
    # What a sandbox whose create gives no resources gets, enforced by the driver and counted
    # by the quotas alike (service/defaults.py): memory ("512Mi"; /dev/shm lives inside it), CPU
    # ("1" core, "500m"), disk ("2Gi"; None: only the host's disk bounds it), processes.
    default_memory: str = _setting("HUTCH_DEFAULT_MEMORY", "512Mi", check=_check_memory)
    default_cpu: str = _setting("HUTCH_DEFAULT_CPU", "1", check=_check_cpu)
    default_disk: str | None = _setting("HUTCH_DEFAULT_DISK", None, check=_check_size)
    # Read by the drivers themselves (drivers/base.py); checked here so a bad one stops the start.
    default_pids: int = _setting("HUTCH_DEFAULT_PIDS", 1024, convert=_to_count)
    # What the local driver's host takes (drivers/local/admission.py): sandboxes at once, and
    # their memory limits in all ("64Gi"; None: 32 x the host's memory). A create past either,
    # or larger than the memory the host has available, is refused 503 NO_CAPACITY.
    max_sandboxes: int = _setting("HUTCH_MAX_SANDBOXES", capacity.MAX_SANDBOXES, convert=_to_count)
    memory_commit_limit: str | None = _setting("HUTCH_MEMORY_COMMIT_LIMIT", None, check=_check_memory_limit)
    # The pids all sandboxes of the local driver hold together (drivers/local/pidstotal.py;
    # None: the host's pid_max less a reserve for the host).
    sandbox_pids_total: int | None = _setting("HUTCH_SANDBOX_PIDS_TOTAL", None, convert=_to_pids_total)
    # The pids each organization's sandboxes hold together, at most that bound (None: half of it).
    org_pids: int | None = _setting("HUTCH_ORG_PIDS", None, convert=_to_org_pids)
    # Disk checkpoints per sandbox: how many, and the bytes they may take on the host (they
    # count against the organization's storage quota too: service/checkpoints.py).
    max_checkpoints: int = _setting("HUTCH_MAX_CHECKPOINTS", 10, convert=_to_count)
    max_checkpoint_bytes: str = _setting("HUTCH_MAX_CHECKPOINT_BYTES", "2Gi", check=_check_size)
    # How long a sandbox's command output is kept after the sandbox ended ("7d", "12h", "0s":
    # at the next sweep); until then it counts against the storage quota (service/retention.py).
    output_retention: str = _setting("HUTCH_OUTPUT_RETENTION", "7d", check=_check_duration)
    # Install layers (a create's packages and dependencies): the server's cache, not a tenant's
    # storage. Bounded in bytes (unused layers go least recently used first; one install
    # larger is refused with a 413) and dropped once unused this long: drivers/local/layercache.py.
    layer_cache_max: str = _setting("HUTCH_LAYER_CACHE_MAX", "4Gi", check=_check_size)
    layer_retention: str = _setting("HUTCH_LAYER_RETENTION", "7d", check=_check_duration)
    # What sandboxes with network may reach besides the internet (core/egress.py): private
    # ranges to open ("10.1.0.0/16,..."; only inside RFC 1918 and CGNAT) and more ranges to
    # close. Read by the drivers from the environment; checked here so a bad one stops the start.
    egress_permit: str = _setting("HUTCH_SANDBOX_EGRESS_PERMIT", "", check=_check_egress)
    egress_deny: str = _setting("HUTCH_SANDBOX_EGRESS_DENY", "", check=_check_egress)
    # A PEM file of CA certificates every sandbox trusts besides its runtime's (a TLS-inspecting
    # proxy's CA): drivers/trust.py. Read by the drivers; checked here so a bad one stops the start.
    sandbox_ca_certs: str | None = _setting("HUTCH_SANDBOX_CA_CERTS", None, check=_check_ca_certs)
    # Requests a second per key (":burst" optional) for keys created without their own rate,
    # and for the bootstrap key; "" = unlimited (service/tenancy.py).
    rate_limit: str = _setting("HUTCH_RATE_LIMIT", "", check=_check_rate)
    # Requests one organization may have under way at once on this server (long-polls, stream
    # reads, terminals, downloads, port requests); None: a quarter of the server's open-file
    # limit, at most 1,000 (api/at_once.py).
    max_requests_per_org: int | None = _setting("HUTCH_MAX_REQUESTS_PER_ORG", None, convert=_to_optional_count)
    # How long a connection has to send a whole request head, from its start or its previous
    # answer's end (so an idle keep-alive connection is closed then too); bytes trickling in do
    # not extend it (edge/listener.py).
    request_head_seconds: float = _setting("HUTCH_REQUEST_HEAD_SECONDS", 10.0, convert=_to_seconds)
    # Connections waiting for a request head, over all of this server's HTTP listeners; past it
    # those waiting longest are closed. None: a quarter of the open-file limit, at most 10,000.
    max_waiting_connections: int | None = _setting("HUTCH_MAX_WAITING_CONNECTIONS", None,
                                                   convert=_to_optional_count)
    # `hutch serve --ssh-port`: the SSH gateway's port on ``host`` (0: any free one); None: no
    # gateway (api/ssh_gateway.py).
    ssh_port: int | None = _setting("HUTCH_SSH_PORT", None, convert=_to_port)
    # `hutch serve --e2b-port`: where E2B's SDK finds this server (E2B_API_URL and
    # E2B_SANDBOX_URL both), on ``host`` (0: any free one); None: not served (api/e2b/).
    e2b_port: int | None = _setting("HUTCH_E2B_PORT", None, convert=_to_port)
    # `hutch serve --e2b-tls-port`: E2B's wire over TLS too, with E2B's host routing: a request
    # to ``{port}-{sandbox id}.{e2b_domain}`` is for that sandbox's port (envd's 49983: its
    # envd), under a certificate of this server's own CA (api/e2b/tls.py). The SDK finds it
    # with E2B_DOMAIN=``{e2b_domain}:{port}``; ``*.localhost`` resolves to this machine.
    e2b_tls_port: int | None = _setting("HUTCH_E2B_TLS_PORT", None, convert=_to_port)
    e2b_domain: str = _setting("HUTCH_E2B_DOMAIN", "e2b.localhost", check=_check_e2b_domain)
    log_level: str = _setting("HUTCH_LOG_LEVEL", "INFO", check=_check_log_level)
    # Several replicas on one PostgreSQL store (core/replicas.py): where the others reach this
    # one (default http://host:port, the host's address when bound to all), and its id
    # (default: the host name and a hash of the data dir, so a restart is the same replica).
    replica_url: str | None = _setting("HUTCH_REPLICA_URL", None, check=_check_http_url)
    replica_id: str | None = _setting("HUTCH_REPLICA_ID", None, check=_check_replica_id)

    @classmethod
    def from_env(cls, **overrides: object) -> Config:
        """Settings from HUTCH_* variables (an empty one counts as unset), then ``overrides``
        (flags; None counts as not given). Raises ``InvalidInput`` naming a bad setting."""
        values: dict[str, object] = {}
        for field in attrs.fields(cls):
            env = field.metadata["env"]
            if env.startswith("HUTCH_") and os.environ.get(env):
                values[field.name] = os.environ[env]
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)  # type: ignore[arg-type]

    @property
    def runtimes_dir(self) -> Path:
        from hutch.drivers.local.rootfs import default_cache  # the local driver owns the layout

        return self.runtime_cache or default_cache()

    @property
    def prebuild_runtimes(self) -> list[str]:
        """The catalog names ``prebuild`` asks for (checked when the Config was made)."""
        return _prebuild_names(self.prebuild)

    @property
    def waiting_connections(self) -> int:
        """The bound on connections waiting for a request head: ``max_waiting_connections``, or
        a share of the open-file limit the process has now (a driver may have raised it)."""
        return self.max_waiting_connections or default_waiting(open_file_limit())

    @property
    def base_url(self) -> str:
        return self.public_url or f"http://{self.host}:{self.port}"

    @property
    def replica(self) -> tuple[str, str]:
        """(id, URL) of this server among the replicas of one deployment."""
        digest = hashlib.sha256(str(self.data_dir.resolve()).encode()).hexdigest()[:8]
        rid = self.replica_id or f"{socket.gethostname()[:40]}-{digest}"
        host = self.host
        if host in ("0.0.0.0", "::", ""):
            host = _own_address()
        elif ":" in host:
            host = f"[{host}]"
        return rid, self.replica_url or f"http://{host}:{self.port}"


def _own_address() -> str:
    """The address this host reaches others from (the default route's interface): a UDP
    socket's connect sends nothing. The host name's address (often 127.0.0.1) without a route."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # TEST-NET-1: only the route is looked up
            return str(probe.getsockname()[0])
        except OSError:
            return socket.gethostbyname(socket.gethostname())


def _prebuild_names(value: str) -> list[str]:
    from hutch.core import runtimes

    wanted = [w.strip() for w in value.split(",") if w.strip()]
    if wanted == ["all"]:
        return [r.name for r in runtimes.CATALOG]
    names = []
    for name in wanted:
        recipe = runtimes.find(name)
        if recipe is None:
            known = ", ".join(r.name for r in runtimes.CATALOG)
            raise InvalidInput(f"HUTCH_PREBUILD: unknown runtime {name!r}; known runtimes: {known}, or all",
                               field="HUTCH_PREBUILD")
        names.append(recipe.name)
    return names


def resolve_api_key(config: Config) -> tuple[str, bool]:
    """The key clients must send. Returns (key, generated_now) so `hutch serve` can print a new one once."""
    if config.api_key:
        return config.api_key, False
    path = config.data_dir / API_KEY_FILE
    if path.exists():
        return path.read_text().strip(), False
    config.data_dir.mkdir(parents=True, exist_ok=True)
    key = "hutch_" + secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(key + "\n")
    return key, True
