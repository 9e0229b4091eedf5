"""service/tar_headers.py: a tar's regular files read from its headers as its bytes pass, in
any slices, whichever format wrote it (ustar, GNU long names, PAX), gzipped or not."""

from __future__ import annotations

import io
import random
import tarfile
import zlib

import pytest

from hutch.service.tar_headers import GzipTarHeaders, TarHeaders


def archive(fmt: int) -> tuple[bytes, list[tuple[str, int, int]]]:
    names = ["a.txt", "d/" + "x" * 150 + "/" + "y" * 90, "é/ü.bin", "./dot"]
    if fmt != tarfile.USTAR_FORMAT:
        names.append("z/" * 200 + "long")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tf:
        for i, name in enumerate(names):
            info = tarfile.TarInfo(name)
            info.size, info.mode = i * 700, 0o640
            tf.addfile(info, io.BytesIO(b"q" * info.size))
        for kind, name, link in ((tarfile.DIRTYPE, "dir", ""), (tarfile.SYMTYPE, "lnk", "a" * 50)):
            info = tarfile.TarInfo(name)
            info.type, info.linkname = kind, link
            tf.addfile(info)
    return buf.getvalue(), [(n.removeprefix("./"), i * 700, 0o640) for i, n in enumerate(names)]


@pytest.mark.parametrize("fmt", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT, tarfile.USTAR_FORMAT])
def test_every_regular_file_is_seen_with_its_size_and_mode(fmt: int) -> None:
    raw, expected = archive(fmt)
    rng = random.Random(fmt)
    seen: list[tuple[str, int, int]] = []
    headers = TarHeaders(lambda *f: seen.append(f))
    pos = 0
    while pos < len(raw):
        step = rng.randint(1, 2000)
        headers.feed(raw[pos:pos + step])
        pos += step
    assert seen == expected and headers.done
    gz = zlib.compressobj(6, zlib.DEFLATED, 31)
    packed = gz.compress(raw) + gz.flush()
    seen.clear()
    inflating = GzipTarHeaders(TarHeaders(lambda *f: seen.append(f)))
    for pos in range(0, len(packed), 333):
        inflating.feed(packed[pos:pos + 333])
    assert seen == expected


def test_what_is_no_tar_ends_the_watch_quietly() -> None:
    seen: list[object] = []
    headers = TarHeaders(lambda *f: seen.append(f))
    headers.feed(b"not a tar at all" * 100)
    assert headers.done and not seen
    inflating = GzipTarHeaders(TarHeaders(lambda *f: seen.append(f)))
    inflating.feed(b"\x1f\x8bnot gzip" * 100)
    assert not seen


def test_a_second_gzip_member_is_watched_as_gzip_readers_read_it() -> None:
    raw, expected = archive(tarfile.PAX_FORMAT)
    half = len(raw) // 3  # anywhere: the members make one stream
    members = b""
    for part in (raw[:half], raw[half:]):
        gz = zlib.compressobj(6, zlib.DEFLATED, 31)
        members += gz.compress(part) + gz.flush()
    seen: list[tuple[str, int, int]] = []
    inflating = GzipTarHeaders(TarHeaders(lambda *f: seen.append(f)))
    inflating.feed(members)
    assert seen == expected
