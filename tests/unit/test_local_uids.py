"""Where a local sandbox dir keeps the uid it claimed: an attribute of the dir, not a file
(one inode fewer a create, docs/idle.md), and the claim released either way."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from hutch.drivers.local import uids


@pytest.fixture
def registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    reg = tmp_path / "uids"
    monkeypatch.setattr(uids, "UID_REGISTRY", reg)
    return reg


def _sandbox_dir(tmp_path: Path, name: str) -> Path:
    d = tmp_path / "sandboxes" / name
    d.mkdir(parents=True)
    return d


def test_claim_is_noted_on_the_dir_without_a_file_and_released(tmp_path: Path, registry: Path) -> None:
    d = _sandbox_dir(tmp_path, "a")
    uid = uids.claim(d)
    uids.record(d, uid)
    assert os.listdir(d) == []  # nothing made in the dir
    assert uids.recorded(d) == uid
    assert (registry / str(uid)).read_text() == str(d)
    uids.release(d)
    assert not (registry / str(uid)).exists()


def test_a_dir_of_an_earlier_server_with_a_uid_file_is_released(tmp_path: Path, registry: Path) -> None:
    d = _sandbox_dir(tmp_path, "b")
    uid = uids.claim(d)
    (d / uids.UID_FILE).write_text(str(uid))  # what servers before the attribute wrote
    uids.release(d)
    assert not (registry / str(uid)).exists()


def test_without_user_attributes_the_uid_goes_in_a_file(tmp_path: Path, registry: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    def unsupported(*_args: object, **_kw: object) -> None:
        raise OSError(errno.EOPNOTSUPP, "Operation not supported")

    d = _sandbox_dir(tmp_path, "c")
    uid = uids.claim(d)
    monkeypatch.setattr(os, "setxattr", unsupported)
    uids.record(d, uid)
    assert (d / uids.UID_FILE).read_text() == str(uid)
    uids.release(d)
    assert not (registry / str(uid)).exists()


def test_another_failure_to_note_the_uid_is_not_swallowed(tmp_path: Path, registry: Path) -> None:
    with pytest.raises(FileNotFoundError):
        uids.record(tmp_path / "gone", uids.UID_BASE)
