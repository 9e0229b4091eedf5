"""What the server's optional parts need from the ``server`` extra, checked before it starts.

``pip install hutch`` is the SDK, the CLI and the embedded default; the production profile,
the nomad driver and the SSH gateway need ``pip install 'hutch[server]'``. A setting that asks
for one of them without its package is refused at start, before anything is announced, with
the command that installs it (not an ImportError halfway through serving).
"""

from __future__ import annotations

import importlib.util

from hutch.service.config import Config

INSTALL = "pip install 'hutch[server]'  (from a checkout: pip install -e '.[server]')"


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def needed(config: Config) -> list[tuple[str, str]]:
    """(what asked for it, the missing module) for every part the settings ask for."""
    wants: list[tuple[str, str]] = []
    if config.event_log.startswith("kafka://"):
        wants.append(("the Kafka event log (HUTCH_EVENT_LOG / --event-log kafka://…)", "aiokafka"))
    if config.store.startswith(("postgresql://", "postgres://")):
        wants.append(("the PostgreSQL store (HUTCH_STORE / --store postgresql://…)", "asyncpg"))
    if config.driver == "nomad":
        wants.append(("the nomad driver (HUTCH_DRIVER / --driver nomad)", "nomad"))
    if config.ssh_port is not None:
        wants.append(("the SSH gateway (HUTCH_SSH_PORT / --ssh-port)", "asyncssh"))
    if config.e2b_tls_port is not None:
        wants.append(("E2B's TLS listener (HUTCH_E2B_TLS_PORT / --e2b-tls-port)", "cryptography"))
    return [(what, module) for what, module in wants if not _installed(module)]


def missing_message(config: Config) -> str | None:
    """A message naming each part that cannot start and how to install what it needs."""
    missing = needed(config)
    if not missing:
        return None
    parts = "; ".join(f"{what} needs {module}" for what, module in missing)
    return f"{parts}, from the server extra, which is not installed: {INSTALL}"
