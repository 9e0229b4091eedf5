"""Forget the host's connection-tracking entries of an address (ctnetlink, no tool needed).

A sandbox's address is handed out again once it is destroyed (network.address), and the
kernel's connection tracking outlives the sandbox: an entry of one of its flows stays until it
times out (a UDP exchange the far end keeps alive, a TCP connection never closed: 5 days). The
firewall accepts established flows (replies into any sandbox veth; a sandbox's own chain lets
its established flows skip its lists), so the next sandbox at that address received the old
one's replies and, spoofing its ports, sent on its flows past its own allow- or deny-list
(tests/adversarial/test_local_address_reuse.py). ``forget`` deletes every entry with the address
at either end of either direction: ``forget_released`` when a sandbox's network is torn down,
``forget_before_use`` before the next one's is set up.

A dump walks the kernel's whole table (10 ms with an empty one here, 20 to 90 ms with 3,500
entries on a busy host), too much for every create with network. So a teardown that forgot
leaves a mark (FORGOTTEN, per network namespace: node agents in other namespaces have tables
of their own), and the next set-up at that address takes the mark instead of a dump (20 µs
here). Nothing
puts an entry with the address back meanwhile: the veth is gone, so the sandbox sends nothing,
and the old flows' far ends now reach the host's own address (their NAT entries are gone); a
packet sent to the address from outside makes at most an unanswered entry, which the firewall
does not take for established. No mark (a teardown that failed, a server killed before its
teardown), a dump.

It speaks netlink (NETLINK_NETFILTER, the ctnetlink subsystem) itself: one dump and one
delete per entry found, about a millisecond, where the `conntrack` tool took 10 to 20 ms a
call (a spawn, then the same dump) and would have been one more package to install.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import os
import socket
import struct
from collections.abc import Iterator
from pathlib import Path

from hutch.core.errors import DriverFailure

NETLINK_NETFILTER = 12
_CTNETLINK = 1 << 8  # NFNL_SUBSYS_CTNETLINK, the high byte of a message's type
_GET, _DELETE = 1, 2  # IPCTNL_MSG_CT_GET, IPCTNL_MSG_CT_DELETE
_REQUEST, _ACK, _DUMP = 0x1, 0x4, 0x300
_ERROR, _DONE = 2, 3  # NLMSG_ERROR, NLMSG_DONE
_TUPLE_ORIG, _TUPLE_REPLY, _ID, _ZONE = 1, 2, 12, 18  # enum ctattr_type
_TUPLE_IP, _IP_V4_SRC, _IP_V4_DST = 1, 1, 2  # enum ctattr_tuple, enum ctattr_ip
_TYPE_MASK = 0x3FFF  # less NLA_F_NESTED and NLA_F_NET_BYTEORDER
_HEADER = struct.Struct("=IHHII")  # struct nlmsghdr
_NFGEN = struct.Struct("=BBH")  # struct nfgenmsg: family, version, res_id (big-endian, 0 here)


# Host-wide, as the uid registry is (uids.py): another server's sandbox may be next at an
# address. One file per network namespace, a bit per sandbox index (8 KiB: a file per address
# would have grown to one per address ever used).
FORGOTTEN = Path(os.environ.get("HUTCH_CONNTRACK_FORGOTTEN", "/run/hutch/conntrack-forgotten"))
_MARKS = 1 << 16


def forget_released(index: int, address: str) -> None:
    """Sandbox ``index``'s network is torn down: forget its address's entries and mark it so."""
    forget(address)
    _update_mark(index, True)


def forget_before_use(index: int, address: str) -> None:
    """Before sandbox ``index``'s network is set up: its address must hold no earlier flow."""
    if not _update_mark(index, False):
        forget(address)


def _update_mark(index: int, value: bool) -> bool:
    """Set index's mark to ``value``; returns whether it was set."""
    if not 0 <= index < _MARKS:
        return False
    FORGOTTEN.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = FORGOTTEN / str(os.stat("/proc/self/ns/net").st_ino)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        byte, bit = divmod(index, 8)
        old = os.pread(fd, 1, byte)
        current = old[0] if old else 0
        os.pwrite(fd, bytes([current | (1 << bit) if value else current & ~(1 << bit)]), byte)
        return bool(current & (1 << bit))
    finally:
        os.close(fd)


def forget(address: str) -> int:
    """Delete the entries with ``address`` (IPv4) at either end of either direction; returns
    how many. ``DriverFailure`` if the kernel's connection tracking cannot be asked."""
    wanted = ipaddress.IPv4Address(address).packed
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER) as sock:
            sock.bind((0, 0))
            # What names an entry to delete it: its original tuple, its id (not a newer entry
            # of the same tuple) and its zone.
            doomed = [b"".join(raw for kind, raw in attrs if kind in (_TUPLE_ORIG, _ID, _ZONE))
                      for attrs in list(_dump(sock, wanted)) if wanted in _ends(attrs)]
            for seq, attrs in enumerate(doomed, 2):
                _delete(sock, seq, attrs)
    except OSError as err:
        raise DriverFailure(f"cannot forget the connection-tracking entries of {address} "
                            f"(ctnetlink, module nf_conntrack_netlink): {err}") from None
    return len(doomed)


def _message(kind: int, flags: int, seq: int, payload: bytes) -> bytes:
    body = _NFGEN.pack(socket.AF_INET, 0, 0) + payload
    return _HEADER.pack(_HEADER.size + len(body), _CTNETLINK | kind, _REQUEST | flags, seq, 0) + body


def _dump(sock: socket.socket, having: bytes) -> Iterator[list[tuple[int, bytes]]]:
    """Every IPv4 entry whose message holds the bytes ``having`` somewhere, as its top-level
    attributes: (type, the attribute's raw bytes). The look for the bytes first: parsing each
    of the host's entries took 40 ms for 3,500 of them, a look at each a millisecond."""
    sock.send(_message(_GET, _DUMP, 1, b""))
    while True:
        data = sock.recv(1 << 20)
        for kind, payload in _messages(data):
            if kind == _DONE:
                return
            if kind == _ERROR:
                _raise_error(payload)
            elif having in payload:
                yield list(_attributes(payload[_NFGEN.size:]))


def _delete(sock: socket.socket, seq: int, attrs: bytes) -> None:
    sock.send(_message(_DELETE, _ACK, seq, attrs))
    for kind, payload in _messages(sock.recv(65536)):
        if kind == _ERROR:
            with contextlib.suppress(FileNotFoundError):  # gone meanwhile (timed out, or its flow ended)
                _raise_error(payload)


def _messages(data: bytes) -> Iterator[tuple[int, bytes]]:
    offset = 0
    while offset + _HEADER.size <= len(data):
        length, kind, _, _, _ = _HEADER.unpack_from(data, offset)
        if length < _HEADER.size:
            return
        yield kind, data[offset + _HEADER.size:offset + length]
        offset += (length + 3) & ~3


def _raise_error(payload: bytes) -> None:
    code = -struct.unpack_from("=i", payload)[0]
    if code:  # 0: an acknowledgement
        raise OSError(code, os.strerror(code))  # ENOENT: FileNotFoundError


def _attributes(data: bytes) -> Iterator[tuple[int, bytes]]:
    """(type, raw attribute: header and value, padded) of each attribute in ``data``."""
    offset = 0
    while offset + 4 <= len(data):
        length, kind = struct.unpack_from("=HH", data, offset)
        if length < 4:
            return
        yield kind & _TYPE_MASK, data[offset:offset + ((length + 3) & ~3)]
        offset += (length + 3) & ~3


def _value(raw: bytes) -> bytes:
    return raw[4:struct.unpack_from("=H", raw)[0]]


def _ends(attrs: list[tuple[int, bytes]]) -> set[bytes]:
    """The addresses of an entry's tuples (both directions, both ends), packed."""
    found: set[bytes] = set()
    for kind, raw in attrs:
        if kind not in (_TUPLE_ORIG, _TUPLE_REPLY):
            continue
        for inner, tuple_raw in _attributes(_value(raw)):
            if inner == _TUPLE_IP:
                found.update(_value(ip) for kind_ip, ip in _attributes(_value(tuple_raw))
                             if kind_ip in (_IP_V4_SRC, _IP_V4_DST))
    return found
