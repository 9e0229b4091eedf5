"""How a nomad file operation's failure is said at the sandbox's pids limit (drivers/nomad/
files.py ``_failure``; the agent's own helpers, helpers.py). The operation's shell could not fork
and said so ("Cannot fork"), or the agent reported its helper's fork refused: each was a 502,
and is now SandboxBusy naming the limit. Live, at a full limit, the
alloc exec may instead lose its stream to Nomad (1006, runc's own clones refused: docs/nomad.md),
so the mapping is tested here, on the shells' own words, not against a filled sandbox; and the
write script's order, under a shell whose forks are refused from a chosen one on."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from hutch.core.errors import DriverFailure, SandboxBusy
from hutch.drivers.nomad import files as files_module
from hutch.drivers.nomad.agent import NoPidLeft
from hutch.drivers.nomad.files import NomadFiles
from hutch.drivers.nomad.helpers import _Run
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


async def test_an_agent_helper_refused_at_the_pids_limit_is_the_pids_limit() -> None:
    """The agent's own file helpers (metadata, watches, disk readings) at a full pids limit: the
    agent reports the refused fork (NoPidLeft), said as SandboxBusy naming the limit (it was a
    502, "the exec agent did not start its helper")."""
    run = _Run.__new__(_Run)  # its agent's answer only: no agent behind it
    run.sandbox_id = "sb-1"
    run.task = asyncio.get_running_loop().create_future()
    run.task.set_exception(NoPidLeft("the sandbox's pids limit refused the command's fork: EAGAIN"))
    with pytest.raises(SandboxBusy, match="sandbox sb-1 is at its pids limit: the helper of this file operation"):
        await run.code()


# fork() and vfork() for the shell the write script runs in, refused (EAGAIN, as at a full pids
# limit) once the count in $HUTCH_TEST_FORKS is spent: each refusal falls at a known point of
# the script, whatever the machine's load.
FORK_SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/file.h>
#include <unistd.h>

static int spend(void) {
    const char *path = getenv("HUTCH_TEST_FORKS");
    int fd = path ? open(path, O_RDWR) : -1, left = 0;
    if (fd < 0) return 1;
    flock(fd, LOCK_EX);
    char buf[32] = {0};
    if (pread(fd, buf, sizeof buf - 1, 0) > 0) left = atoi(buf);
    if (left > 0) {
        int n = snprintf(buf, sizeof buf, "%d\n", left - 1);
        if (ftruncate(fd, 0) == 0 && pwrite(fd, buf, (size_t)n, 0) != n) left = 0;
    }
    close(fd);
    return left > 0;
}

pid_t fork(void) {
    if (!spend()) { errno = EAGAIN; return -1; }
    return ((pid_t (*)(void))dlsym(RTLD_NEXT, "fork"))();
}

pid_t vfork(void) { return fork(); }
"""


@pytest.fixture(scope="module")
def fork_shim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    gcc = shutil.which("gcc")
    assert gcc, "gcc is not installed (./scripts/install installs it): the fork shim cannot be built"
    where = tmp_path_factory.mktemp("shim")
    (where / "shim.c").write_text(FORK_SHIM)
    subprocess.run([gcc, "-shared", "-fPIC", "-o", str(where / "shim.so"), str(where / "shim.c"), "-ldl"],
                   check=True, capture_output=True)
    return where / "shim.so"


def write_with_forks(shim: Path, workspace: Path, forks: int, path: str, content: bytes) -> tuple[int, str]:
    """The write script as the driver runs it (its stdin sent only after its "ok"), its shell
    allowed ``forks`` forks in all; (exit code, stderr)."""
    counter = workspace.parent / "forks"
    counter.write_text(f"{forks}\n")
    env = {"PATH": "/usr/bin:/bin", "LD_PRELOAD": str(shim), "HUTCH_TEST_FORKS": str(counter)}
    with subprocess.Popen(["/bin/sh", "-c", files_module._SCRIPT, "hutch-fs", "write", path, "644", "1"],
                          cwd=workspace, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE) as proc:
        assert proc.stdin is not None and proc.stdout is not None
        if proc.stdout.readline() == b"ok\n":
            proc.stdin.write(content)
        _, err = proc.communicate(timeout=30)
    return proc.returncode, err.decode()


@pytest.mark.parametrize("forks", range(5))
def test_a_write_refused_a_fork_leaves_the_old_content(fork_shim: Path, tmp_path: Path, forks: int) -> None:
    """A nomad write at the sandbox's pids limit: whichever fork is the first refused, the file
    has its old content or the new, never nothing. The script cut the file as it opened it
    and forked chmod and cat after: a tenant's processes taking the last pid in between left
    it empty (and the answer was SandboxBusy). Now every fork comes before the cut."""
    workspace = tmp_path / "home"
    workspace.mkdir()
    (workspace / "kept.txt").write_bytes(b"old content\n")
    code, err = write_with_forks(fork_shim, workspace, forks, "kept.txt", b"new content\n")
    content = (workspace / "kept.txt").read_bytes()
    if code == 0:
        assert content == b"new content\n", err
    else:
        assert content == b"old content\n", (forks, code, err)
        assert "Cannot fork" in err, err
    if forks == 4:
        assert code == 0, err  # enough for the whole write
