"""Server configuration: flags win over HUTCH_* environment variables, which win over defaults."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import attrs

from core.errors import InvalidInput
from core.paths import API_KEY_FILE, default_data_dir

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8700


@attrs.frozen
class Config:
    data_dir: Path = attrs.field(factory=default_data_dir, converter=Path)
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    # "sqlite" (default: <data_dir>/events.db) or a URL: sqlite:///path, kafka://host:port/topic
    event_log: str = "sqlite"
    # "memory" (default) or postgresql://...
    store: str = "memory"
    # "inprocess" (default): this server applies the log to the store. "external": a separate
    # `hutch projector` does (PostgreSQL only); this server waits for it (read-your-writes).
    projector: str = "inprocess"
    driver: str = "local"  # local | fake | nomad
    api_key: str | None = None  # None: read or generate <data_dir>/api-key
    public_url: str | None = None  # base for absolute stream URLs; default http://host:port
    output_cap_bytes: int = 16 * 2**20  # per stream, per execution; then outputTruncated
    max_body_bytes: int = 64 * 2**20  # JSON bodies (base64 file writes included)
    max_upload_bytes: int = 4 * 2**30  # one archive upload, streamed to disk
    max_archive_entries: int = 100_000
    runtime_cache: Path | None = None  # where built runtimes live (HUTCH_RUNTIME_CACHE)
    # The nomad driver (scripts/services start nomad prints these):
    nomad_addr: str = "http://127.0.0.1:4646"  # HUTCH_NOMAD_ADDR
    nomad_token: str | None = None  # HUTCH_NOMAD_TOKEN (ACL token)
    nomad_registry: str = "127.0.0.1:5000"  # HUTCH_NOMAD_REGISTRY: where the runtime images are
    # HUTCH_NOMAD_POOL: warm pools: "auto" (adaptive, drivers/nomad/pools.py), "off", or fixed
    # sizes "base:latest=2,python:3.13=1"; HUTCH_NOMAD_POOL_MEMORY: their MiB per client node.
    nomad_pool: str = "auto"
    nomad_pool_memory: str = ""
    # HUTCH_PREBUILD: catalog runtimes to build at start ("all", or names, comma-separated);
    # any other runtime is built at its first use.
    prebuild: str = ""
    # HUTCH_SANDBOX_DOMAIN: a wildcard domain pointing at this server ("sandboxes.example.com",
    # with a ":port" when not on 80/443): port URLs become {port}-{id}.{domain} (api/routes/proxy.py).
    sandbox_domain: str | None = None
    # HUTCH_DEFAULT_DISK: the disk limit ("2Gi") of a sandbox whose create gives none; None: unlimited.
    default_disk: str | None = attrs.field(default=None, validator=lambda _i, _a, v: _check_size(v))
    # HUTCH_RATE_LIMIT: requests a second per key (":burst" optional) for keys created without
    # their own rate, and for the bootstrap key; "" = unlimited (api/tenancy.py).
    rate_limit: str = attrs.field(default="", validator=lambda _i, _a, v: _check_rate(v))
    # HUTCH_SSH_PORT / `hutch serve --ssh-port`: the SSH gateway's port on ``host`` (0: any free
    # one); None: no gateway (api/ssh_gateway.py).
    ssh_port: int | None = None

    @classmethod
    def from_env(cls, **overrides: object) -> Config:
        env = os.environ
        values: dict[str, object] = {}
        for field, var in (
            ("data_dir", "HUTCH_DATA_DIR"),
            ("host", "HUTCH_HOST"),
            ("port", "HUTCH_PORT"),
            ("event_log", "HUTCH_EVENT_LOG"),
            ("store", "HUTCH_STORE"),
            ("projector", "HUTCH_PROJECTOR"),
            ("driver", "HUTCH_DRIVER"),
            ("api_key", "HUTCH_API_KEY"),
            ("public_url", "HUTCH_PUBLIC_URL"),
            ("runtime_cache", "HUTCH_RUNTIME_CACHE"),
            ("nomad_addr", "HUTCH_NOMAD_ADDR"),
            ("nomad_token", "HUTCH_NOMAD_TOKEN"),
            ("nomad_registry", "HUTCH_NOMAD_REGISTRY"),
            ("nomad_pool", "HUTCH_NOMAD_POOL"),
            ("nomad_pool_memory", "HUTCH_NOMAD_POOL_MEMORY"),
            ("prebuild", "HUTCH_PREBUILD"),
            ("sandbox_domain", "HUTCH_SANDBOX_DOMAIN"),
            ("default_disk", "HUTCH_DEFAULT_DISK"),
            ("rate_limit", "HUTCH_RATE_LIMIT"),
            ("ssh_port", "HUTCH_SSH_PORT"),
        ):
            if env.get(var):
                values[field] = env[var]
        values.update({k: v for k, v in overrides.items() if v is not None})
        for port in ("port", "ssh_port"):
            if port in values:
                try:
                    values[port] = int(values[port])  # type: ignore[arg-type]
                except ValueError:
                    raise InvalidInput(f"{port}: expected a port number, got {values[port]!r}", field=port) from None
        if "runtime_cache" in values:
            values["runtime_cache"] = Path(values["runtime_cache"])  # type: ignore[arg-type]
        return cls(**values)  # type: ignore[arg-type]

    @property
    def runtimes_dir(self) -> Path:
        from drivers.local.rootfs import default_cache  # the local driver owns the layout

        return self.runtime_cache or default_cache()

    @property
    def prebuild_runtimes(self) -> list[str]:
        """The catalog names ``prebuild`` asks for; an unknown one is refused by name."""
        from core import runtimes

        wanted = [w.strip() for w in self.prebuild.split(",") if w.strip()]
        if wanted == ["all"]:
            return [r.name for r in runtimes.CATALOG]
        names = []
        for name in wanted:
            recipe = runtimes.find(name)
            if recipe is None:
                known = ", ".join(r.name for r in runtimes.CATALOG)
                raise InvalidInput(f"prebuild: unknown runtime {name!r}; known runtimes: {known}, or all",
                                   field="prebuild")
            names.append(recipe.name)
        return names

    @property
    def base_url(self) -> str:
        return self.public_url or f"http://{self.host}:{self.port}"


def _check_size(value: str | None) -> None:
    from core.quantities import parse_bytes

    if value is not None:
        parse_bytes("HUTCH_DEFAULT_DISK", value)  # an InvalidInput naming it


def _check_rate(value: str) -> None:
    from api.tenancy import parse_rate

    parse_rate(value)  # an InvalidInput naming HUTCH_RATE_LIMIT


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
