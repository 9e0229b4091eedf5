"""The composition root: the one place that turns settings into the parts hutch runs on —
the event log, the projection store, the projector, the blob store, the output streams and
the driver. The server (``api.app``), the operator commands (``projections.commands``), the
benchmarks and the tests all build their parts here, so a backend is chosen in one place only.

Building a part opens nothing: each is started (and closed) by whoever runs it.
"""

from __future__ import annotations

from pathlib import Path

import attrs

from hutch.core.blobs import BlobStore
from hutch.core.errors import InvalidInput
from hutch.core.eventlog.base import EventLog
from hutch.core.output import OutputStreams
from hutch.core.quantities import parse_bytes, parse_duration
from hutch.core.replicas import Replicas, SoleReplica
from hutch.drivers.base import Driver
from hutch.projections.base import ProjectionStore
from hutch.projections.runner import Projector
from hutch.service.config import Config

_POSTGRES = ("postgresql://", "postgres://")


def open_event_log(url: str, data_dir: Path, *, read_only: bool = False) -> EventLog:
    """``sqlite`` (default: <data_dir>/events.db), ``sqlite:///abs/path.db``, or
    ``kafka://HOST:PORT/TOPIC`` (see ``eventlog.kafka``).

    ``read_only``: for readers that never append (``hutch projector``, ``hutch audit``); on
    Kafka it opens no producer and runs no indexer, so it never fences the server's."""
    if url in ("sqlite", "embedded", ""):
        from hutch.eventlog.sqlite import SqliteEventLog

        return SqliteEventLog(data_dir / "events.db")
    if url.startswith("sqlite://"):
        from hutch.eventlog.sqlite import SqliteEventLog

        return SqliteEventLog(Path(url.removeprefix("sqlite://")))
    if url.startswith("kafka://"):
        from hutch.eventlog.kafka import KafkaEventLog  # aiokafka only where Kafka is used

        return KafkaEventLog.from_url(url, data_dir, writer=not read_only)
    raise InvalidInput(
        f"event log: unsupported URL {url!r}; expected 'sqlite', sqlite:///path or kafka://host:port/topic",
        field="event_log",
    )


def open_store(url: str) -> ProjectionStore:
    """``memory`` (the default: rebuilt from the log at every start) or ``postgresql://…``."""
    if url in ("memory", ""):
        from hutch.projections.memory import MemoryProjectionStore

        return MemoryProjectionStore()
    if url.startswith(_POSTGRES):
        from hutch.projections.postgres import PostgresProjectionStore  # asyncpg only where used

        return PostgresProjectionStore(url)
    raise InvalidInput(f"store: unsupported store {url!r}; expected memory or postgresql://…", field="store")


def open_persistent_store(url: str) -> ProjectionStore:
    """A store that outlives the process, for the jobs that fill one for others to read
    (``hutch projector``, ``hutch projections rebuild``); the memory store is refused."""
    if not url.startswith(_POSTGRES):
        raise InvalidInput(
            f"store: {url!r} is not a persistent store; a separate projector and rebuild need "
            "postgresql://… (the memory store is rebuilt by every server at start)",
            field="store",
        )
    return open_store(url)


def open_blob_store(store: str, data_dir: Path) -> BlobStore:
    """Shared state (snapshot archives, disk checkpoints): PostgreSQL large objects with a
    PostgreSQL store, so every replica reaches it; else files under the data dir (blobs/)."""
    if store.startswith(_POSTGRES):
        from hutch.blobs.postgres import PostgresBlobStore  # asyncpg only where used

        return PostgresBlobStore(store)
    from hutch.blobs.files import FileBlobStore

    return FileBlobStore(data_dir)


def open_output_streams(store: str, data_dir: Path, cap_bytes: int) -> OutputStreams:
    """Executions' output streams: chunks in PostgreSQL with a PostgreSQL store, so any
    replica serves them and they outlive the host; else files under the data dir."""
    if store.startswith(_POSTGRES):
        from hutch.blobs.output_postgres import PostgresOutputStreams  # asyncpg only where used

        return PostgresOutputStreams(store, cap_bytes)
    from hutch.blobs.output_files import FileOutputStreams

    return FileOutputStreams(data_dir, cap_bytes)


def open_driver(config: Config, blobs: BlobStore) -> Driver:
    if config.driver == "fake":
        from hutch.drivers.fake.driver import FakeDriver

        return FakeDriver()
    if config.driver == "local":
        from hutch.drivers.local.admission import HostLimits
        from hutch.drivers.local.driver import LocalDriver
        from hutch.drivers.local.layercache import LayerLimits

        limits = LayerLimits(max_bytes=parse_bytes("HUTCH_LAYER_CACHE_MAX", config.layer_cache_max),
                             retention_seconds=parse_duration("HUTCH_LAYER_RETENTION", config.layer_retention))
        commit = config.memory_commit_limit
        host = HostLimits(max_sandboxes=config.max_sandboxes,
                          memory_limit=None if commit is None else parse_bytes("HUTCH_MEMORY_COMMIT_LIMIT", commit))
        return LocalDriver(data_dir=config.data_dir, runtime_cache=config.runtimes_dir, layer_limits=limits,
                           pool_memory=parse_bytes("HUTCH_DEFAULT_MEMORY", config.default_memory), host_limits=host,
                           pids_total=config.sandbox_pids_total, org_pids=config.org_pids)
    if config.driver == "nomad":
        from hutch.drivers.nomad.driver import NomadDriver, pool_sizing_from_env

        return NomadDriver(address=config.nomad_addr, data_dir=config.data_dir, registry=config.nomad_registry,
                           token=config.nomad_token,
                           pool_sizing=pool_sizing_from_env(config.nomad_pool, config.nomad_pool_memory),
                           runtime_cache=config.runtimes_dir, blobs=blobs, exec_mode=config.nomad_exec,
                           max_checkpoint_bytes=parse_bytes("HUTCH_MAX_CHECKPOINT_BYTES", config.max_checkpoint_bytes),
                           layer_max_bytes=parse_bytes("HUTCH_LAYER_CACHE_MAX", config.layer_cache_max))
    if config.driver == "node":
        return _node_driver(config)
    raise InvalidInput(f"driver: unknown driver {config.driver!r}; expected local, nomad, node or fake", field="driver")


def _node_driver(config: Config) -> Driver:
    from hutch.drivers.node.directory import AgentDirectory, StaticDirectory
    from hutch.drivers.node.driver import NodeDriver

    if config.node_secret_file is not None:
        try:
            secret = config.node_secret_file.read_bytes().strip()
        except OSError as err:
            raise InvalidInput(f"HUTCH_NODE_SECRET_FILE: cannot read {config.node_secret_file}: {err.strerror}",
                               field="HUTCH_NODE_SECRET_FILE") from None
        where = "HUTCH_NODE_SECRET_FILE"
    elif config.node_secret:
        secret, where = config.node_secret.encode(), "HUTCH_NODE_SECRET"
    else:
        raise InvalidInput("HUTCH_NODE_SECRET_FILE (or HUTCH_NODE_SECRET): the node driver needs the cluster's "
                           "node secret", field="HUTCH_NODE_SECRET_FILE")
    if len(secret) < 32:
        raise InvalidInput(f"{where}: the node secret must be at least 32 bytes", field=where)
    directory: AgentDirectory
    if config.node_agents:
        directory = StaticDirectory(config.node_agents)
    else:  # the hutch-node system job's registrations: a node that joins is placed on at once
        from hutch.drivers.node.catalog import NomadAgentDirectory

        directory = NomadAgentDirectory(config.nomad_addr, config.nomad_token, config.node_service,
                                        config.node_namespace)
    return NodeDriver(directory, secret)


def open_replicas(config: Config) -> Replicas:
    """Leases and sandbox owners in PostgreSQL with a PostgreSQL store (several replicas can
    share it: api/replication.py); else this process is the only one."""
    replica_id, url = config.replica
    if config.store.startswith(_POSTGRES):
        from hutch.projections.replicas import PostgresReplicas  # asyncpg only where used

        return PostgresReplicas(config.store, me=replica_id, url=url)
    return SoleReplica(replica_id, url)


def make_projector(event_log: EventLog, store: ProjectionStore, *, external: bool = False) -> Projector:
    """The projector a process runs. ``external``: another process (``hutch projector``)
    applies the log, and this one waits for the shared store to show each position."""
    if external and not store.capabilities.shared:
        raise InvalidInput("HUTCH_PROJECTOR: external needs a shared store (HUTCH_STORE=postgresql://…)",
                           field="HUTCH_PROJECTOR")
    return Projector(event_log, store, apply=not external)


@attrs.frozen
class ServerParts:
    """What a server runs on, built but not started."""

    event_log: EventLog
    store: ProjectionStore
    projector: Projector
    driver: Driver
    blobs: BlobStore
    outputs: OutputStreams
    replicas: Replicas


def server_parts(config: Config) -> ServerParts:
    """The server's parts, as ``config`` chooses them."""
    event_log = open_event_log(config.event_log, config.data_dir)
    store = open_store(config.store)
    projector = make_projector(event_log, store, external=config.projector == "external")
    blobs = open_blob_store(config.store, config.data_dir)
    return ServerParts(event_log=event_log, store=store, projector=projector, driver=open_driver(config, blobs),
                       blobs=blobs, outputs=open_output_streams(config.store, config.data_dir,
                                                                config.output_cap_bytes),
                       replicas=open_replicas(config))
