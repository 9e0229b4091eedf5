"""A local sandbox's account by another name (``ProvisionRequest.user``, what the E2B wire
asks for: E2B's ``user``, home /home/user): its passwd entry, home, environment, working
directory and file paths are that account's, and a name that could corrupt /etc/passwd or
pose as root makes no sandbox."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from hutch.core.errors import InvalidInput
from hutch.drivers.base import ProvisionRequest
from hutch.drivers.local.driver import LocalDriver
from tests.drivers_support import (
    built_runtimes,  # noqa: F401  (fixture)
    local_data_dir,  # noqa: F401  (fixture)
    new_id,
)
from tests.isolation.test_local_isolation import run

pytestmark = pytest.mark.isolation


async def _out(driver: LocalDriver, sid: str, script: str, **kw: object) -> str:
    result, sink = await run(driver, sid, "/bin/bash", "-c", script, **kw)
    assert result.exit_code == 0, sink.chunks
    return b"".join(data for stream, data, _ in sink.chunks if stream == "stdout").decode()


async def test_a_sandbox_runs_as_the_account_it_names(driver: LocalDriver) -> None:
    sid = new_id()
    await driver.provision(ProvisionRequest(sandbox_id=sid, runtime="base:latest", user="user"))
    try:
        who = await _out(driver, sid, 'id -un; id -gn; echo "$HOME $USER $LOGNAME"; pwd; stat -c %U .; '
                                      'test -w /home/agentuity && echo writable || echo read-only')
        # /home/agentuity: the runtime tree's own empty directory, root's, not this account's.
        assert who.split("\n") == ["user", "user", "/home/user user user", "/home/user", "user", "read-only", ""]
        await driver.write_file(sid, "notes/a.txt", _chunks(b"mine"), parents=True)  # relative: the home
        assert await _out(driver, sid, "cat /home/user/notes/a.txt; stat -c %U notes/a.txt") == "mineuser\n"
        assert await _out(driver, sid, "pwd", cwd="notes") == "/home/user/notes\n"
        assert [i.name for i in await driver.list_files(sid, "notes")] == ["a.txt"]
    finally:
        await driver.destroy(sid)
    default = new_id()
    await driver.provision(ProvisionRequest(sandbox_id=default, runtime="base:latest"))
    try:  # the other sandboxes keep hutch's own account
        assert await _out(driver, default, 'id -un; echo "$HOME"; pwd') == "agentuity\n/home/agentuity\n/home/agentuity\n"
    finally:
        await driver.destroy(default)


@pytest.mark.parametrize("name", ["root", "bin", "users", "a:b", "x\nroot::0:0::/:/bin/sh", "Upper", "", "a" * 33])
async def test_a_name_that_is_not_a_new_plain_account_makes_no_sandbox(driver: LocalDriver, name: str) -> None:
    sid = new_id()
    with pytest.raises(InvalidInput) as caught:
        await driver.provision(ProvisionRequest(sandbox_id=sid, runtime="base:latest", user=name))
    assert caught.value.field == "user" and repr(name)[:20] in caught.value.message
    assert sid not in await driver.alive()


async def _chunks(data: bytes) -> AsyncIterator[bytes]:
    yield data
