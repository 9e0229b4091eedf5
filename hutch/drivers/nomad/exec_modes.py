"""How the nomad driver runs a command (``HUTCH_NOMAD_EXEC``), checkable without the driver.

service/config.py checks every setting when a server starts, whatever its driver; importing the
driver itself for that would need the server extra (python-nomad) on a plain
``pip install hutch`` running the embedded default.
"""

from __future__ import annotations

from hutch.core.errors import InvalidInput

# "agent": a per-sandbox exec agent forks each command (drivers/nomad/agents.py);
# "alloc": each command is its own Nomad alloc exec (a runc exec, ~45 ms more).
MODES = ("agent", "alloc")


def check_mode(setting: str, value: str) -> None:
    if value not in MODES:
        raise InvalidInput(f"{setting}: expected agent or alloc, got {value!r}", field=setting)
