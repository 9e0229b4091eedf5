"""Freezing a cgroup that is removed meanwhile: an execution's leaf goes when its last process
ends, which may be while a kill (E2B's SendSignal, a cancel) freezes it. That ended in an
"internal error" answer (ENODEV from freezer.state): it means nothing is left to kill."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from hutch.drivers.local.cgroups import CgroupV1
from hutch.drivers.local.cgroups_v2 import CgroupV2


def _gone(*_args: object, **_kwargs: object) -> str:
    raise OSError(errno.ENODEV, "No such device")


def test_a_v1_leaf_removed_while_it_is_frozen_is_no_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "freezer.state").write_text("THAWED")
    monkeypatch.setattr(Path, "read_text", _gone)
    CgroupV1({})._freeze(tmp_path, True)


def test_a_v2_leaf_removed_before_its_freeze_is_no_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("hutch.drivers.local.cgroupfs.write", _gone)
    CgroupV2(tmp_path, frozenset())._freeze(tmp_path, True)


def test_other_errors_still_say_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def denied(*_args: object, **_kwargs: object) -> None:
        raise OSError(errno.EACCES, "Permission denied")
    monkeypatch.setattr("hutch.drivers.local.cgroupfs.write", denied)
    with pytest.raises(PermissionError):
        CgroupV1({})._freeze(tmp_path, True)


def test_a_leaf_removed_while_its_processes_are_listed_has_none(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from hutch.drivers.local import cgroupfs

    (tmp_path / "cgroup.procs").write_text("1\n")
    monkeypatch.setattr(Path, "read_text", _gone)
    assert cgroupfs.pids_below(tmp_path) == []
