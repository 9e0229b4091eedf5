"""drivers/trees.py over the fake driver's file primitives: what the contract tests on real
backends do not reach (a source failing mid-way, members the service would have refused)."""

from __future__ import annotations

import io
import tarfile
import threading
from collections.abc import AsyncIterator

import pytest

from hutch.core.errors import InvalidInput
from hutch.drivers import trees
from hutch.drivers.base import ProvisionRequest
from hutch.drivers.fake.driver import FakeDriver


def _tar(*members: tuple[tarfile.TarInfo, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for info, data in members:
            info.size = len(data) if info.isreg() else 0
            tf.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return buf.getvalue()


def _file(name: str, data: bytes, mode: int = 0o644) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.mode = mode
    return info, data


async def _chunks(data: bytes, size: int = 700) -> AsyncIterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i:i + size]


@pytest.fixture
async def fake() -> AsyncIterator[FakeDriver]:
    driver = FakeDriver()
    await driver.start()
    await driver.provision(ProvisionRequest(sandbox_id="sb1", runtime="base:latest"))
    yield driver
    await driver.destroy("sb1")
    await driver.close()


async def _read(driver: FakeDriver, path: str) -> bytes:
    return b"".join([c async for c in driver.read_file("sb1", path)])


async def test_a_tar_written_from_files_unpacks_to_the_same_files(fake: FakeDriver) -> None:
    big = bytes(range(256)) * 4000  # several chunks of the thread's reads
    tar = _tar(_file("a/b.txt", b"hello"), _file("big.bin", big, 0o600))
    assert await trees.untar_into_files(fake, "sb1", "out", _chunks(tar), gzipped=False) == 5 + len(big)
    assert await _read(fake, "out/a/b.txt") == b"hello" and await _read(fake, "out/big.bin") == big
    again = b"".join([c async for c in trees.tar_from_files(fake, "sb1", "out")])
    with tarfile.open(fileobj=io.BytesIO(again)) as tf:
        assert sorted(tf.getnames()) == ["a", "a/b.txt", "big.bin"]


async def test_a_source_failing_midway_fails_with_its_own_error_and_leaves_no_thread(fake: FakeDriver) -> None:
    tar = _tar(_file("one.txt", b"1" * 50_000), _file("two.txt", b"2" * 50_000))

    async def broken() -> AsyncIterator[bytes]:
        yield tar[:20_000]
        raise ConnectionResetError("the client went away")

    with pytest.raises(ConnectionResetError, match="went away"):
        await trees.untar_into_files(fake, "sb1", "cut", broken(), gzipped=False)
    assert not [t for t in threading.enumerate() if t.name == "tar-unpack"]


@pytest.mark.parametrize("kind", [tarfile.LNKTYPE, tarfile.CHRTYPE, tarfile.FIFOTYPE])
async def test_links_and_special_members_are_refused(fake: FakeDriver, kind: bytes) -> None:
    odd = tarfile.TarInfo("odd")
    odd.type, odd.linkname = kind, "ok.txt"
    tar = _tar(_file("ok.txt", b"fine"), (odd, b""))
    with pytest.raises(InvalidInput, match=r"'odd'.*refused"):
        await trees.untar_into_files(fake, "sb1", "dst", _chunks(tar), gzipped=False)


@pytest.mark.parametrize("name", ["/etc/passwd", "../up.txt", "a/../../up.txt"])
async def test_names_leaving_the_destination_are_refused(fake: FakeDriver, name: str) -> None:
    with pytest.raises(InvalidInput, match="leaves the destination"):
        await trees.untar_into_files(fake, "sb1", "dst", _chunks(_tar(_file(name, b"x"))), gzipped=False)
