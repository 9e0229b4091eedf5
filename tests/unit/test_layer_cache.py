"""The install-layer cache (drivers/local/layercache.py): bounded by size, least recently used
first, unused layers dropped after their retention, and never a layer an overlay on this
host is mounted over or a create holds. Made-up layers in a temporary cache: no install."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hutch.drivers.local import layercache
from hutch.drivers.local.layercache import LayerLimits

MIB = 2**20
DAY = 24 * 3600.0


def make_layer(root: Path, n: int, size: int, used: float) -> str:
    key = f"{n:024x}"
    tree = root / key / "tree"
    tree.mkdir(parents=True)
    (tree / "blob").write_bytes(os.urandom(size))
    (root / key / "used").touch()
    os.utime(root / key / "used", (used, used))
    return key


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "layers"


def test_unused_layers_go_after_their_retention_and_the_rest_stay(root: Path) -> None:
    now = time.time()
    old, recent = make_layer(root, 1, 4096, now - 2 * DAY), make_layer(root, 2, 4096, now - 60)
    assert layercache.sweep(root, LayerLimits(max_bytes=64 * MIB, retention_seconds=DAY), now) == [old]
    assert not (root / old).exists() and (root / recent / "tree").is_dir()
    assert not list(root.glob(".trash-*"))


def test_over_its_bound_the_cache_drops_the_least_recently_used_until_it_fits(root: Path) -> None:
    now = time.time()
    keys = [make_layer(root, n, MIB, now - 100 + n) for n in range(5)]  # keys[0]: used longest ago
    assert layercache.sweep(root, LayerLimits(max_bytes=int(3.5 * MIB), retention_seconds=DAY), now) == keys[:2]
    assert sorted(p.name for p in root.iterdir() if not p.name.startswith(".")) == keys[2:]
    assert all((root / k / "size").read_text().strip() for k in keys[2:])  # measured once, kept


def test_a_layer_a_create_holds_is_not_dropped(root: Path) -> None:
    key = make_layer(root, 1, 4096, time.time() - 2 * DAY)
    with layercache.using(root, key):
        assert layercache.sweep(root, LayerLimits(max_bytes=1, retention_seconds=0)) == []
    assert (root / key / "tree").is_dir()
    assert layercache.sweep(root, LayerLimits(max_bytes=1, retention_seconds=0)) == [key]


@pytest.fixture
def mounted_over(root: Path, tmp_path: Path) -> Iterator[str]:
    """A layer some other mount namespace has an overlay over (as a sandbox's would be)."""
    key = make_layer(root, 7, 4096, time.time() - 2 * DAY)
    for d in ("runtime", "upper", "work", "merged"):
        (tmp_path / d).mkdir()
    opts = (f"lowerdir={root / key / 'tree'}:{tmp_path / 'runtime'},upperdir={tmp_path / 'upper'},"
            f"workdir={tmp_path / 'work'}")
    proc = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                             f"mount -t overlay overlay -o {opts} {tmp_path / 'merged'} && echo up && sleep 60"],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "up", "the overlay did not mount"
        yield key
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()  # type: ignore[union-attr]


def test_a_layer_an_overlay_is_mounted_over_is_never_dropped(root: Path, mounted_over: str) -> None:
    assert layercache.mounted(root) == {mounted_over}
    assert layercache.sweep(root, LayerLimits(max_bytes=1, retention_seconds=0)) == []
    assert (root / mounted_over / "tree" / "blob").is_file()
    used = (root / mounted_over / "used").stat().st_mtime
    assert used > time.time() - 60, "a layer in use is marked used: its retention starts when it is let go"


DEEP = 1500  # past Python's recursion limit: shutil.rmtree and os.walk recurse once per level


def _nest(parent: Path, depth: int) -> None:
    fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            nxt = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nxt
        with open(os.open("blob", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd), "wb") as fh:
            fh.write(b"x" * 8192)
    finally:
        os.close(fd)


@pytest.fixture
def deep_root(root: Path) -> Iterator[Path]:
    """``root``, emptied with rm -rf after the test: a deep tree a failing sweep left would make
    pytest's own cleanup of old temporary directories die of RecursionError later."""
    yield root
    subprocess.run(["rm", "-rf", "--one-file-system", "--", str(root)], check=False)


def test_a_layer_nested_deeper_than_python_recurses_is_measured_and_dropped(deep_root: Path) -> None:
    """A layer's tree is what its packages' files are (an npm tarball's paths): one nested
    1,500 deep neither stops the sweep (every sweep raised RecursionError, so the cache's
    bound held no more, for anyone) nor stays in its trash."""
    now = time.time()
    deep = make_layer(deep_root, 1, 4096, now - 2 * DAY)
    _nest(deep_root / deep / "tree", DEEP)
    stuck = deep_root / ".trash-000000000000000000000009-0000"  # a sweep that died removing it
    stuck.mkdir()
    _nest(stuck, DEEP)
    other = make_layer(deep_root, 2, 4096, now - 2 * DAY)
    assert layercache.tree_bytes(deep_root / deep / "tree") >= 8192 + 4096
    assert sorted(layercache.sweep(deep_root, LayerLimits(max_bytes=64 * MIB, retention_seconds=DAY), now)) == \
        sorted([deep, other])
    assert not (deep_root / deep).exists() and not (deep_root / other).exists()
    assert not list(deep_root.glob(".trash-*")), "a dropped layer's tree stayed"


def test_a_layer_held_by_a_sandbox_paused_filesystem_only_stays_until_it_lets_go(root: Path) -> None:
    """Paused filesystem-only, a sandbox has its layer mounted nowhere (fspause.py): its hold
    keeps the layer past its retention and over the bound, as a mount would, until the
    last sandbox holding it resumes (or ends)."""
    now = time.time()
    key = make_layer(root, 1, 4096, now - 30 * DAY)
    layercache.asleep(root, key, "sbx_a", holding=True)
    layercache.asleep(root, key, "sbx_b", holding=True)
    tight = LayerLimits(max_bytes=1, retention_seconds=DAY)
    assert layercache.sweep(root, tight, now) == [] and (root / key / "tree").is_dir()
    assert layercache.drop(root, key) is False
    layercache.asleep(root, key, "sbx_a", holding=False)
    assert layercache.sweep(root, tight, now) == []  # sbx_b still holds it
    layercache.asleep(root, key, "sbx_b", holding=False)
    layercache.asleep(root, None, "sbx_c", holding=True)  # no layer: nothing to hold
    assert layercache.held_asleep(root) == set()
    assert layercache.sweep(root, tight, time.time() + 40 * DAY) == [key]
