"""service/archives.py follows an archive's own links when it checks where they lead."""

from __future__ import annotations

import io
import tarfile
import time
import zipfile
from pathlib import Path

import pytest

from hutch.core.errors import InvalidInput
from hutch.service import archives


def _tar(path: Path, entries: list[tuple[str, str | None]]) -> str:
    """``(name, link target)`` each: a link, or (None) a one-byte file."""
    with tarfile.open(path, "w:gz") as tf:
        for name, target in entries:
            info = tarfile.TarInfo(name)
            if target is None:
                info.size = 1
                tf.addfile(info, io.BytesIO(b"x"))
            else:
                info.type, info.linkname = tarfile.SYMTYPE, target
                tf.addfile(info)
    return str(path)


def test_links_that_stay_inside_pass(tmp_path: Path) -> None:
    found = archives.check_tar(_tar(tmp_path / "a.tgz", [
        ("node_modules/pkg/bin/cli.js", None), ("node_modules/.bin/cli", "../pkg/bin/cli.js"),
        ("cur", "node_modules"), ("up", "node_modules/.."), ("node_modules/.bin/x", None),
        ("loop", "loop"),  # a loop: ELOOP, nothing written through it
    ]), archives.Limits())
    assert len(found) == 6


def test_nothing_is_written_through_a_link_of_the_archive(tmp_path: Path) -> None:
    """Its name would not say where it lands (a link ``b/c`` under ``b -> .`` is ``c``): refused,
    wherever the link leads; no tar or zip tool writes an entry so."""
    for entries in ([("cur", "node_modules"), ("cur/more.js", None)], [("b", "."), ("b/c", "."), ("a", "c/..")]):
        with pytest.raises(InvalidInput, match="passes through the archive's link"):
            archives.check_tar(_tar(tmp_path / "a.tgz", entries), archives.Limits())


@pytest.mark.parametrize("entries", [
    [("here", "."), ("x/up", "../here/..")],  # as written the destination; here is it too: one up
    [("b", "."), ("c", "."), ("a", "b/c/..")],  # as written b; b/c is the destination: one up
    [("x/y/up", "../.."), ("x/y/up/l", "../../../tmp")],  # a link through a link
    [("x/y/up", "../.."), ("x/y/up/l/f", None), ("x/y/up/l", "../../../tmp")],  # the link after the file
])
def test_links_out_by_way_of_other_links_are_refused(tmp_path: Path, entries: list[tuple[str, str | None]]) -> None:
    with pytest.raises(InvalidInput, match=r"by way of the archive's other links|passes through the archive's link"):
        archives.check_tar(_tar(tmp_path / "a.tgz", entries), archives.Limits())


def test_zip_links_are_followed_too(tmp_path: Path) -> None:
    path = tmp_path / "a.zip"
    with zipfile.ZipFile(path, "w") as zf:
        for name, target in (("x/y/up", "../.."), ("x/y/up/l", "../../../tmp")):
            info = zipfile.ZipInfo(name)
            info.external_attr = (0o120777 << 16)
            zf.writestr(info, target)
        zf.writestr("x/y/up/l/f", "x")
    with pytest.raises(InvalidInput, match=r"by way of the archive's other links|passes through the archive's link"):
        archives._zip_members(str(path), archives.Limits())


def test_deep_trees_are_walked_in_bounded_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A directory is walked once; an archive that would take more steps than the bound is
    refused, not followed for minutes (a string per step: 400 entries 1,000 deep took 1.5 s)."""
    deep = "/".join(["d"] * 1000)
    entries: list[tuple[str, str | None]] = [("l", "d"), *((f"{deep}/f{i}", None) for i in range(300))]
    path = _tar(tmp_path / "a.tgz", entries)
    started = time.monotonic()
    assert len(archives.check_tar(path, archives.Limits())) == 301
    assert time.monotonic() - started < 5  # one walk of the directory, ~1,000 steps
    monkeypatch.setattr(archives, "_MAX_STEPS", 500)
    with pytest.raises(InvalidInput, match="too many steps"):
        archives.check_tar(path, archives.Limits())
