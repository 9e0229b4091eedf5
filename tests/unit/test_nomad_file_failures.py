"""How a nomad file operation's failure is said (drivers/nomad/files.py ``_failure``). At the
sandbox's pids limit the operation's shell could not fork and said so ("Cannot fork"); that was
a 502 quoting the shell, and is now SandboxBusy naming the limit. Live, at a full limit, the
alloc exec may instead lose its stream to Nomad (1006, runc's own clones refused: docs/nomad.md),
so the mapping is tested here, on the shells' own words, not against a filled sandbox."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from hutch.core.errors import DriverFailure, SandboxBusy
from hutch.drivers.nomad.files import NomadFiles
from hutch.drivers.nomad.state import NomadSandbox

SB = NomadSandbox("sb-1", "hutch-job", "alloc-1", "base:latest", {})


def files() -> NomadFiles:
    made = NomadFiles.__new__(NomadFiles)  # only its failure wording is used: no Nomad behind it
    made._access = SimpleNamespace(gone=lambda sandbox_id: False)  # type: ignore[assignment]
    return made


@pytest.mark.parametrize("said", [b"hutch-fs: 28: Cannot fork\n", b"sh: can't fork\n"])  # dash's, busybox's
def test_a_shell_that_cannot_fork_is_the_pids_limit(said: bytes) -> None:
    err = files()._failure(SB, "list", "/tmp", 2, said)
    assert isinstance(err, SandboxBusy) and err.status == 409
    assert err.message.startswith("sandbox sb-1 is at its pids limit: file operation list on /tmp")


def test_another_failure_is_still_the_drivers() -> None:
    err = files()._failure(SB, "list", "/tmp", 2, b"hutch-fs: something else broke\n")
    assert type(err) is DriverFailure and "something else broke" in err.message
