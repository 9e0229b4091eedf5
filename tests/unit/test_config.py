"""The server's settings (service/config.py): each is converted and checked when a Config is
made, a bad one is refused in one line naming it, and the server exits with that line."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import attrs
import pytest

from hutch.core.errors import InvalidInput
from hutch.service.composition import make_projector, open_event_log, open_store
from hutch.service.config import Config

ROOT = Path(__file__).resolve().parents[2]

# (field, a value it accepts and what it becomes, a value it refuses, the refusal it gives)
SETTINGS = [
    ("host", "0.0.0.0", "0.0.0.0", "http://x", "HUTCH_HOST: expected a host name or IP address, got 'http://x'"),
    ("port", "8080", 8080, "eighty", "HUTCH_PORT: expected a port number (0-65535), got 'eighty'"),
    ("port", 0, 0, 65536, "HUTCH_PORT: expected a port number (0-65535), got 65536"),
    ("event_log", "kafka://k:9092/events", "kafka://k:9092/events", "kafka://k:9092",
     "HUTCH_EVENT_LOG: expected sqlite, sqlite:///PATH or kafka://HOST:PORT/TOPIC, got 'kafka://k:9092'"),
    ("event_log", "sqlite:///tmp/e.db", "sqlite:///tmp/e.db", "mysql://db",
     "HUTCH_EVENT_LOG: expected sqlite, sqlite:///PATH or kafka://HOST:PORT/TOPIC, got 'mysql://db'"),
    ("store", "postgresql://u@h:5432/d", "postgresql://u@h:5432/d", "redis://h",
     "HUTCH_STORE: expected memory or postgresql://USER@HOST:PORT/DATABASE, got 'redis://h'"),
    ("projector", "external", "external", "elsewhere",
     "HUTCH_PROJECTOR: expected inprocess or external, got 'elsewhere'"),
    ("driver", "nomad", "nomad", "docker", "HUTCH_DRIVER: expected local, nomad, node or fake, got 'docker'"),
    ("node_agents", "c1=10.0.0.1:7700,c2=10.0.0.2:7700", "c1=10.0.0.1:7700,c2=10.0.0.2:7700", "c1=10.0.0.1",
     "HUTCH_NODE_AGENTS: expected name=host:port[,…], got 'c1=10.0.0.1'"),
    ("node_secret", "k" * 32, "k" * 32, "k" * 31, "HUTCH_NODE_SECRET: the node secret must be at least 32 bytes"),
    ("node_service", "hutch-node-eu", "hutch-node-eu", "hutch node",
     "HUTCH_NODE_SERVICE: expected a Nomad service name (letters, digits and dashes, at most 63), got 'hutch node'"),
    ("node_service", "n1", "n1", "", "HUTCH_NODE_SERVICE: expected a Nomad service name"),
    ("node_namespace", "hutch-system", "hutch-system", "hutch/system",
     "HUTCH_NODE_NAMESPACE: expected a Nomad namespace (letters, digits and dashes, at most 128), "
     "got 'hutch/system'"),
    ("api_key", "hutch_abc", "hutch_abc", "two words", "HUTCH_API_KEY: expected a secret without spaces"),
    ("public_url", "https://hutch.example.com", "https://hutch.example.com", "hutch.example.com",
     "HUTCH_PUBLIC_URL: expected an http:// or https:// URL, got 'hutch.example.com'"),
    ("output_cap_bytes", "1024", 1024, 0, "output_cap_bytes: expected a positive whole number, got 0"),
    ("max_body_bytes", 2**20, 2**20, "big", "max_body_bytes: expected a positive whole number, got 'big'"),
    ("max_upload_bytes", 2**30, 2**30, -1, "max_upload_bytes: expected a positive whole number, got -1"),
    ("max_archive_entries", 10, 10, True, "max_archive_entries: expected a positive whole number, got True"),
    ("nomad_addr", "http://nomad:4646", "http://nomad:4646", "nomad:4646",
     "HUTCH_NOMAD_ADDR: expected an http:// or https:// URL, got 'nomad:4646'"),
    ("nomad_token", "secret-token", "secret-token", "a\tb", "HUTCH_NOMAD_TOKEN: expected a secret without spaces"),
    ("nomad_registry", "registry.local:5000", "registry.local:5000", "http://registry",
     "HUTCH_NOMAD_REGISTRY: expected HOST:PORT of a container registry (no scheme), got 'http://registry'"),
    ("nomad_pool", "base:latest=2", "base:latest=2", "lots",
     "HUTCH_NOMAD_POOL: expected auto, off or runtime=count,…; got 'lots'"),
    ("nomad_pool_memory", "4096", "4096", "4G", "HUTCH_NOMAD_POOL_MEMORY: expected MiB per client node, got '4G'"),
    ("nomad_exec", "alloc", "alloc", "runc", "HUTCH_NOMAD_EXEC: expected agent or alloc, got 'runc'"),
    ("prebuild", "base:latest,python:3.13", "base:latest,python:3.13", "ruby:3",
     "HUTCH_PREBUILD: unknown runtime 'ruby:3'"),
    ("sandbox_domain", "sandboxes.example.com:8700", "sandboxes.example.com:8700", "https://sandboxes.example.com",
     "HUTCH_SANDBOX_DOMAIN: expected HOST or HOST:PORT, got 'https://sandboxes.example.com'"),
    ("default_disk", "2Gi", "2Gi", "lots", "HUTCH_DEFAULT_DISK"),
    ("default_memory", "1Gi", "1Gi", "8Mi", "HUTCH_DEFAULT_MEMORY: expected at least 16Mi"),
    ("default_cpu", "500m", "500m", "fast", "HUTCH_DEFAULT_CPU"),
    ("default_pids", "256", 256, "many", "HUTCH_DEFAULT_PIDS: expected a positive whole number, got 'many'"),
    ("max_sandboxes", "10000", 10000, "lots", "HUTCH_MAX_SANDBOXES: expected a positive whole number, got 'lots'"),
    ("memory_commit_limit", "64Gi", "64Gi", "8Mi", "HUTCH_MEMORY_COMMIT_LIMIT: expected at least 16Mi"),
    ("sandbox_pids_total", "20000", 20000, "8", "HUTCH_SANDBOX_PIDS_TOTAL: expected a whole number of at least 16, got '8'"),
    ("org_pids", "5000", 5000, "half", "HUTCH_ORG_PIDS: expected a whole number of at least 16, got 'half'"),
    ("max_checkpoints", "4", 4, "0", "HUTCH_MAX_CHECKPOINTS: expected a positive whole number, got '0'"),
    ("max_checkpoint_bytes", "1Gi", "1Gi", "lots", "HUTCH_MAX_CHECKPOINT_BYTES"),
    ("output_retention", "12h", "12h", "a week", "HUTCH_OUTPUT_RETENTION"),
    ("layer_cache_max", "10Gi", "10Gi", "half the disk", "HUTCH_LAYER_CACHE_MAX"),
    ("layer_retention", "1d", "1d", "a while", "HUTCH_LAYER_RETENTION"),
    ("egress_permit", "10.1.0.0/16", "10.1.0.0/16", "169.254.0.0/16",
     "HUTCH_SANDBOX_EGRESS_PERMIT: 169.254.0.0/16 is not inside a private range"),
    ("egress_deny", "203.0.113.0/24", "203.0.113.0/24", "fd00::/8", "HUTCH_SANDBOX_EGRESS_DENY: 'fd00::/8'"),
    ("sandbox_ca_certs", "/etc/ssl/certs/ca-certificates.crt", "/etc/ssl/certs/ca-certificates.crt",
     "/nonexistent.pem", "HUTCH_SANDBOX_CA_CERTS: cannot read /nonexistent.pem"),
    ("rate_limit", "20:100", "20:100", "fast", "HUTCH_RATE_LIMIT: expected requests per second"),
    ("max_requests_per_org", "200", 200, "0", "HUTCH_MAX_REQUESTS_PER_ORG: expected a positive whole number, got '0'"),
    ("request_head_seconds", "2.5", 2.5, "-1", "HUTCH_REQUEST_HEAD_SECONDS: expected a number of seconds above 0, got '-1'"),
    ("request_head_seconds", "10", 10.0, "nan", "HUTCH_REQUEST_HEAD_SECONDS: expected a number of seconds above 0, got 'nan'"),
    ("max_waiting_connections", "500", 500, "lots",
     "HUTCH_MAX_WAITING_CONNECTIONS: expected a positive whole number, got 'lots'"),
    ("ssh_port", "2222", 2222, "ssh", "HUTCH_SSH_PORT: expected a port number (0-65535), got 'ssh'"),
    ("e2b_port", "3000", 3000, "e2b", "HUTCH_E2B_PORT: expected a port number (0-65535), got 'e2b'"),
    ("e2b_tls_port", "3443", 3443, "70000", "HUTCH_E2B_TLS_PORT: expected a port number (0-65535), got '70000'"),
    ("e2b_domain", "sandboxes.example.com", "sandboxes.example.com", "localhost",
     "HUTCH_E2B_DOMAIN: expected a lowercase DNS name of two labels at least"),
    ("log_level", "DEBUG", "DEBUG", "loud", "HUTCH_LOG_LEVEL: expected DEBUG, INFO, WARNING, ERROR or CRITICAL, got 'loud'"),
    ("replica_url", "http://10.0.0.5:8700", "http://10.0.0.5:8700", "10.0.0.5:8700",
     "HUTCH_REPLICA_URL: expected an http:// or https:// URL, got '10.0.0.5:8700'"),
    ("replica_id", "api-1", "api-1", "api 1", "HUTCH_REPLICA_ID: expected 1-64 letters, digits, '_', '.' or '-'"),
]


@pytest.mark.parametrize(("field", "good", "becomes", "bad", "refusal"), SETTINGS,
                         ids=[f"{s[0]}-{s[3]!r}" for s in SETTINGS])
def test_each_setting_is_checked_and_a_bad_one_is_refused_by_name(
    field: str, good: object, becomes: object, bad: object, refusal: str
) -> None:
    assert getattr(Config(**{field: good}), field) == becomes  # type: ignore[arg-type]
    with pytest.raises(InvalidInput) as caught:
        Config(**{field: bad})  # type: ignore[arg-type]
    assert caught.value.message.startswith(refusal)
    assert "\n" not in caught.value.message


def test_every_setting_is_covered_here() -> None:
    covered = {s[0] for s in SETTINGS} | {"data_dir", "runtime_cache", "node_secret_file"}  # paths: any text is one
    assert covered == {f.name for f in attrs.fields(Config)}


def test_secrets_are_never_echoed() -> None:
    for field in ("api_key", "nomad_token", "node_secret"):
        with pytest.raises(InvalidInput) as caught:
            Config(**{field: "hunter2 with spaces"})  # type: ignore[arg-type]
        assert "hunter2" not in caught.value.message


def test_variables_are_read_and_flags_win(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in [n for n in os.environ if n.startswith("HUTCH_")]:  # the test services' settings
        monkeypatch.delenv(name)
    monkeypatch.setenv("HUTCH_PORT", "9000")
    monkeypatch.setenv("HUTCH_SSH_PORT", "0")
    monkeypatch.setenv("HUTCH_RUNTIME_CACHE", str(tmp_path))
    monkeypatch.setenv("HUTCH_DRIVER", "")  # empty counts as unset
    config = Config.from_env(data_dir=tmp_path, host=None)
    assert (config.port, config.ssh_port, config.runtime_cache) == (9000, 0, tmp_path)
    assert config.driver == "local" and config.host == "127.0.0.1" and config.data_dir == tmp_path
    assert Config.from_env(port=9100).port == 9100
    monkeypatch.setenv("HUTCH_PORT", "eighty")
    with pytest.raises(InvalidInput, match=r"^HUTCH_PORT: expected a port number"):
        Config.from_env()


def test_an_external_projector_needs_a_shared_store(tmp_path: Path) -> None:
    store = open_store("memory")
    with pytest.raises(InvalidInput, match=r"^HUTCH_PROJECTOR: external needs a shared store"):
        make_projector(open_event_log("sqlite", tmp_path), store, external=True)
    assert make_projector(open_event_log("sqlite", tmp_path), store).applies


@pytest.mark.parametrize("command", [["api"], ["hutch", "serve"]])
def test_the_server_exits_with_the_one_line_naming_the_setting(command: list[str], tmp_path: Path) -> None:
    env = {**{n: v for n, v in os.environ.items() if not n.startswith("HUTCH_")},
           "PYTHONPATH": str(ROOT), "HUTCH_PORT": "eighty", "HUTCH_DATA_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", *command], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and done.stdout == ""
    assert done.stderr.startswith("hutch: error: HUTCH_PORT: expected a port number (0-65535), got 'eighty'")
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr


def test_a_replica_is_named_by_its_host_and_data_dir_and_reached_at_its_address(tmp_path: Path) -> None:
    rid, url = Config(data_dir=tmp_path, host="127.0.0.1", port=8123).replica
    assert rid.endswith("-" + hashlib.sha256(str(tmp_path.resolve()).encode()).hexdigest()[:8])
    assert url == "http://127.0.0.1:8123"
    assert Config(data_dir=tmp_path, port=8123).replica[0] == rid  # a restart is the same replica
    assert Config(data_dir=tmp_path / "other").replica[0] != rid
    rid, url = Config(data_dir=tmp_path, host="0.0.0.0", port=8123).replica
    assert not url.startswith(("http://0.0.0.0", "http://127.")), url  # bound to all: the host's address
    assert Config(replica_id="api-1", replica_url="http://lb:1").replica == ("api-1", "http://lb:1")


def test_settings_are_checked_without_the_server_extras(tmp_path: Path) -> None:
    """`pip install hutch` has no python-nomad: checking HUTCH_NOMAD_POOL must not need it
    (drivers/nomad/pools.py imported placement.py at the top, and `hutch run` failed)."""
    script = ("import sys; sys.modules['nomad'] = None\n"
              "from hutch.service.config import Config\n"
              f"Config(data_dir={str(tmp_path)!r}, nomad_pool='auto', nomad_pool_memory='512')\n"
              "print('checked')")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False)
    assert done.returncode == 0 and done.stdout.strip() == "checked", done.stderr[-2000:]


@pytest.mark.parametrize(("settings", "refusal"), [
    ({}, "HUTCH_NODE_SECRET_FILE (or HUTCH_NODE_SECRET): the node driver needs"),
    ({"node_agents": "c1=127.0.0.1:7700"}, "HUTCH_NODE_SECRET_FILE (or HUTCH_NODE_SECRET): the node driver needs"),
    ({"node_agents": "c1=127.0.0.1:7700", "node_secret_file": "/nonexistent"},
     "HUTCH_NODE_SECRET_FILE: cannot read /nonexistent"),
])
def test_the_node_driver_needs_its_secret(settings: dict[str, str], refusal: str) -> None:
    from hutch.service.composition import open_driver

    with pytest.raises(InvalidInput) as caught:
        open_driver(Config(driver="node", **settings), None)  # type: ignore[arg-type]
    assert caught.value.message.startswith(refusal)


def test_the_node_driver_without_a_list_follows_the_agents_in_nomads_catalog() -> None:
    """No HUTCH_NODE_AGENTS: the agents are the hutch-node system job's registrations, read
    with the nomad driver's address and token (docs/node.md)."""
    from hutch.drivers.node.catalog import NomadAgentDirectory
    from hutch.drivers.node.directory import StaticDirectory
    from hutch.service.composition import open_driver

    secret = "k" * 32
    driver = open_driver(Config(driver="node", node_secret=secret, nomad_addr="http://nomad.internal:4646",
                                nomad_token="tok-1"), None)  # type: ignore[arg-type]
    catalog = driver._directory  # type: ignore[attr-defined]
    assert isinstance(catalog, NomadAgentDirectory)
    assert (catalog.service, catalog.namespace) == ("hutch-node", "hutch-system")
    assert catalog._client.address == "http://nomad.internal:4646"
    assert catalog._client.token == "tok-1"

    driver = open_driver(Config(driver="node", node_secret=secret, node_service="agents-eu",
                                node_namespace="infra"), None)  # type: ignore[arg-type]
    assert (driver._directory.service, driver._directory.namespace) == ("agents-eu", "infra")  # type: ignore[attr-defined]

    # A static list wins: the catalog is not asked.
    driver = open_driver(Config(driver="node", node_secret=secret, node_agents="c1=127.0.0.1:7700"),
                         None)  # type: ignore[arg-type]
    assert isinstance(driver._directory, StaticDirectory)  # type: ignore[attr-defined]


def test_the_e2b_tls_listener_without_cryptography_is_refused_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its certificate is made with ``cryptography`` (the server extra brings it with asyncssh):
    without it the start is refused naming the setting, not an ImportError while serving."""
    from hutch.service import extras

    monkeypatch.setattr(extras, "_installed", lambda module: module != "cryptography")
    assert extras.missing_message(Config(e2b_port=0)) is None
    message = extras.missing_message(Config(e2b_port=0, e2b_tls_port=0))
    assert message is not None and "HUTCH_E2B_TLS_PORT" in message and "needs cryptography" in message


def test_the_e2b_tls_port_alone_is_refused_at_start(tmp_path: Path) -> None:
    """The TLS listener is the E2B wire's second side: asked for without the wire it is refused
    naming both settings, not quietly left unserved."""
    env = {**os.environ, "HUTCH_DATA_DIR": str(tmp_path / "data"), "HUTCH_E2B_TLS_PORT": "0", "HUTCH_PORT": "0"}
    env.pop("HUTCH_E2B_PORT", None)
    done = subprocess.run([sys.executable, "-m", "hutch.api"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "it needs HUTCH_E2B_PORT (--e2b-port) too" in done.stderr, done.stderr[-2000:]
    assert not (tmp_path / "data").exists()


def test_the_sandbox_pids_bound_leaves_the_host_a_reserve_and_a_node_agent_reads_it() -> None:
    from hutch.drivers.local import pidstotal
    from hutch.node.config import SettingError, pids_total

    assert pidstotal.default(32768) == 32768 - 8192  # a quarter kept for the host
    assert pidstotal.default(4194304) == 4194304 - 1048576
    assert pidstotal.default(8192) == 8192 - pidstotal.RESERVE_MIN
    assert pids_total({}) is None and pids_total({"HUTCH_SANDBOX_PIDS_TOTAL": "2000"}) == 2000
    with pytest.raises(SettingError, match="HUTCH_SANDBOX_PIDS_TOTAL: expected a whole number of at least 16, got 'x'"):
        pids_total({"HUTCH_SANDBOX_PIDS_TOTAL": "x"})


def test_an_organizations_pids_share_is_half_the_bound_unless_set_and_never_above_it() -> None:
    from hutch.drivers.local import pidstotal
    from hutch.node.config import SettingError, org_pids

    assert pidstotal.org_default(24576) == 12288 and pidstotal.org_default(20) == pidstotal.MINIMUM
    assert org_pids({}) is None and org_pids({"HUTCH_ORG_PIDS": "3000"}) == 3000
    assert org_pids({"HUTCH_ORG_PIDS": "2000", "HUTCH_SANDBOX_PIDS_TOTAL": "2000"}) == 2000
    with pytest.raises(SettingError, match="HUTCH_ORG_PIDS: expected a whole number of at least 16, got '8'"):
        org_pids({"HUTCH_ORG_PIDS": "8"})
    with pytest.raises(SettingError, match=r"HUTCH_ORG_PIDS: expected at most the pids all sandboxes may hold "
                                           r"together \(HUTCH_SANDBOX_PIDS_TOTAL: 2000\), got 3000"):
        org_pids({"HUTCH_ORG_PIDS": "3000", "HUTCH_SANDBOX_PIDS_TOTAL": "2000"})
