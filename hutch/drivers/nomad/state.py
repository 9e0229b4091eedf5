"""What the nomad driver remembers of a sandbox across restarts: its record, one small JSON
file per sandbox under ``<data dir>/nomad``, written whole (temp file, then rename)."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import attrs


@attrs.define
class NomadSandbox:
    """What the driver knows of a live sandbox: its job, allocation, runtime and env."""

    id: str
    job_id: str
    alloc_id: str
    runtime: str
    env: dict[str, str]
    port_target: tuple[str, int] | None = attrs.field(default=None, eq=False)  # read from Nomad, cached
    allow: dict[str, list[str]] = attrs.field(factory=dict)  # network.allow: each entry's CIDRs (egress.py)
    checkpoints: dict[str, int] = attrs.field(factory=dict)  # the bytes each checkpoint takes in the blob store


class StateFiles:
    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir

    def path(self, sid: str) -> Path:
        return self.state_dir / f"{sid}.json"

    def save(self, sb: NomadSandbox) -> None:
        tmp = self.path(sb.id).with_suffix(".tmp")
        tmp.write_text(json.dumps(attrs.asdict(sb)))
        tmp.rename(self.path(sb.id))

    def forget(self, sid: str) -> None:
        self.path(sid).unlink(missing_ok=True)

    def load_all(self) -> list[NomadSandbox]:
        found: list[NomadSandbox] = []
        if not self.state_dir.is_dir():
            return found
        for path in self.state_dir.glob("*.json"):
            with contextlib.suppress(OSError, ValueError, TypeError):
                found.append(NomadSandbox(**json.loads(path.read_text())))
        return found
