"""Disk limits: a limited sandbox's writable layer lives on a file system of the limit's size.

Why a file system per sandbox: this kernel has no disk quotas (ext4 and XFS are built
without CONFIG_QUOTA; only btrfs qgroups, which answer EDQUOT, not ENOSPC), and a limit
must look like a full disk from inside: ENOSPC at the limit, ``df`` showing it, the host's
disk untouched, and deleting files makes room again. So a sandbox created with
``resources.disk`` gets a sparse image file of that size in its directory, formatted ext4,
loop-mounted at ``<dir>/disk``; its overlay's upper and work directories are inside, and
``<dir>/upper`` and ``<dir>/work`` are symlinks to them, so the rest of the driver (the
launcher, checkpoints) keeps its paths.

What it costs a create: not mkfs. An ext4 made by mkfs is ~150 KiB of metadata in a
sparse file; the first create of a size runs mkfs once into a template and keeps those
extents in memory, and every later one writes them into a fresh sparse file (well under a
millisecond), attaches a loop device with one LOOP_CONFIGURE ioctl and mounts it with one
mount(2) (see the README for the figures). The file system has no journal (a sandbox's
disk does not outlive a host crash: its sandbox is ended at the next start anyway) and is
mounted ``noinit_itable``, so the kernel does not zero inode tables in the background (it
would write megabytes into every image). The loop device is set to clear itself when the
last mount of it goes, so a sandbox's namespace still holding the mount for a moment after
destroy is harmless.

Root only: loop devices and mounts need CAP_SYS_ADMIN in the host's namespaces, so
rootless mode refuses ``resources.disk`` by name (provisioning._check_rootless).
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import struct
import subprocess
import tempfile
import threading
from pathlib import Path

from hutch.core.errors import DriverFailure

IMAGE = "disk.img"
MOUNT = "disk"

_LOOP_CTL_GET_FREE = 0x4C82
_LOOP_CONFIGURE = 0x4C0A
_LO_FLAGS_AUTOCLEAR = 4
_MS_NOSUID, _MS_NODEV = 2, 4
_MNT_DETACH = 2

_libc = ctypes.CDLL(None, use_errno=True)
_templates: dict[int, list[tuple[int, bytes]]] = {}
_templates_lock = threading.Lock()


def attach(d: Path, size: int) -> None:
    """Give sandbox dir ``d`` a ``size``-byte file system holding its upper and work dirs."""
    mnt = d / MOUNT
    make(d / IMAGE, mnt, size)
    for name in ("upper", "work"):
        (mnt / name).mkdir()
        os.symlink(f"{MOUNT}/{name}", d / name)


def make(img: Path, mnt: Path, size: int) -> None:
    """A fresh ``size``-byte file system in the new (sparse) image file ``img``, mounted at the
    new directory ``mnt`` (nosuid, nodev). Also the Workspace's docker backend's disk bound."""
    extents = _template(size)
    fd = os.open(img, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        os.ftruncate(fd, size)
        for offset, data in extents:
            os.pwrite(fd, data, offset)
        mnt.mkdir(mode=0o700)
        _mount_image(fd, mnt)
    finally:
        os.close(fd)


def remount(img: Path, mnt: Path) -> None:
    """Mount the file system of an existing image at ``mnt`` again (its mount went with a
    reboot; its files are all in the image)."""
    fd = os.open(img, os.O_RDWR | os.O_CLOEXEC)
    try:
        _mount_image(fd, mnt)
    finally:
        os.close(fd)


def _mount_image(fd: int, mnt: Path) -> None:
    loop = _loop_attach(fd)
    try:
        _mount(f"/dev/loop{loop[1]}", mnt)
    finally:
        os.close(loop[0])  # the mount holds the device now; it clears when unmounted


def attached(d: Path) -> bool:
    return os.path.ismount(d / MOUNT)


def detach(d: Path) -> None:
    """Unmount ``d``'s disk (lazily: a dying sandbox may still hold it) and delete its image."""
    unmount(d / MOUNT, d / IMAGE)


def unmount(mnt: Path, img: Path) -> None:
    """Unmount ``mnt`` (lazily: a process may still hold it) and delete its image ``img``."""
    if os.path.ismount(mnt) and _libc.umount2(os.fsencode(mnt), _MNT_DETACH) != 0:
        num = ctypes.get_errno()
        raise DriverFailure(f"unmounting the disk of {mnt.parent.name} failed: {os.strerror(num)}")
    img.unlink(missing_ok=True)


def _template(size: int) -> list[tuple[int, bytes]]:
    """The data extents of a fresh ext4 of ``size`` bytes (mkfs once per size)."""
    with _templates_lock:
        found = _templates.get(size)
        if found is not None:
            return found
        with tempfile.TemporaryDirectory(prefix="hutch-disk-") as tmp:
            img = os.path.join(tmp, "template.img")
            with open(img, "wb") as fh:
                fh.truncate(size)
            proc = subprocess.run(
                ["mkfs.ext4", "-q", "-F", "-b", "4096", "-m", "0", "-O", "^has_journal,^resize_inode",
                 "-E", "lazy_itable_init=1,nodiscard,root_owner=0:0", img],
                capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                raise DriverFailure(f"making a {size}-byte file system for a disk limit failed: "
                                    f"{proc.stderr.strip()[-500:]}")
            extents = _data_extents(img)
        if len(_templates) > 32:  # sizes users asked for; a few in practice
            _templates.pop(next(iter(_templates)))
        _templates[size] = extents
        return extents


def _data_extents(path: str) -> list[tuple[int, bytes]]:
    out = []
    fd = os.open(path, os.O_RDONLY)
    try:
        end, pos = os.fstat(fd).st_size, 0
        while pos < end:
            try:
                start = os.lseek(fd, pos, os.SEEK_DATA)
            except OSError as err:
                if err.errno == errno.ENXIO:  # only a hole is left
                    break
                raise
            stop = os.lseek(fd, start, os.SEEK_HOLE)
            out.append((start, os.pread(fd, stop - start, start)))
            pos = stop
    finally:
        os.close(fd)
    return out


def _loop_attach(backing_fd: int) -> tuple[int, int]:
    """A free loop device set up over ``backing_fd`` (autoclear); returns (its fd, its number)."""
    # struct loop_config: fd, block_size, struct loop_info64 (lo_flags at byte 52), reserved.
    info = bytearray(232)
    struct.pack_into("I", info, 52, _LO_FLAGS_AUTOCLEAR)
    config = struct.pack("II", backing_fd, 0) + bytes(info) + bytes(64)
    ctl = os.open("/dev/loop-control", os.O_RDWR | os.O_CLOEXEC)
    try:
        for _ in range(50):  # another attach may take the free device first: EBUSY, next one
            number = fcntl.ioctl(ctl, _LOOP_CTL_GET_FREE)
            lfd = os.open(f"/dev/loop{number}", os.O_RDWR | os.O_CLOEXEC)
            try:
                fcntl.ioctl(lfd, _LOOP_CONFIGURE, config)
                return lfd, number
            except OSError as err:
                os.close(lfd)
                if err.errno != errno.EBUSY:
                    raise DriverFailure(f"setting up a loop device for a disk limit failed: {err}") from err
    finally:
        os.close(ctl)
    raise DriverFailure("no free loop device for a disk limit")


def _mount(device: str, target: Path) -> None:
    if _libc.mount(device.encode(), os.fsencode(target), b"ext4", _MS_NOSUID | _MS_NODEV, b"noinit_itable") != 0:
        num = ctypes.get_errno()
        raise DriverFailure(f"mounting the disk of {target.parent.name} failed: {os.strerror(num)}")
