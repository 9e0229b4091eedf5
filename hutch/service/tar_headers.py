"""A tar stream's regular files, read from its headers as the stream passes (no seeking, no
file data kept): what lets a snapshot's export or upload be refused at the entry that makes
it too large, instead of after the whole archive was read, spooled and scanned.

Understands ustar (with its name prefix), GNU long names and PAX ``path``/``size`` records, as
Python's tarfile and GNU tar write them. A header it cannot read ends the watch quietly: the
scan after it (service/snapshots.py ``scan``) refuses such an archive with its own words.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

# A PAX record or a GNU long name is kept whole to be read; one larger than this is no name.
_META_MAX = 2**20
_REGULAR = (b"0", b"\0", b"7", b"S")


class TarHeaders:
    """Fed a tar's bytes in any slices, calls ``on_file(name, size, mode)`` for each regular
    file as its header passes (before its data does); what it raises stops the stream."""

    def __init__(self, on_file: Callable[[str, int, int], None]) -> None:
        self._on_file = on_file
        self._head = bytearray()  # a header block being gathered
        self._skip = 0  # bytes of file data and padding still to pass
        self._meta: bytearray | None = None  # a long name or PAX records being gathered
        self._meta_kind = b""
        self._meta_left = 0
        self._skip_after_meta = 0  # a long name's or PAX records' padding
        self._long_name: str | None = None
        self._pax: dict[str, str] = {}
        self.done = False  # the end blocks (or an unreadable header) were seen

    def feed(self, data: bytes) -> None:
        view = memoryview(data)
        while view and not self.done:
            if self._skip:
                n = min(self._skip, len(view))
                self._skip -= n
                view = view[n:]
            elif self._meta is not None:
                n = min(self._meta_left, len(view))
                self._meta += view[:n]
                self._meta_left -= n
                view = view[n:]
                if not self._meta_left:
                    self._end_meta()
            else:
                n = min(512 - len(self._head), len(view))
                self._head += view[:n]
                view = view[n:]
                if len(self._head) == 512:
                    block, self._head = bytes(self._head), bytearray()
                    self._header(block)

    def _header(self, block: bytes) -> None:
        if block == bytes(512) or not _checksum_ok(block):
            self.done = True
            return
        kind = block[156:157]
        size = _number(block[124:136])
        if size is None:
            self.done = True
            return
        padded = size + (-size % 512)
        if kind in (b"K", b"g"):  # a long link name, global PAX records: nothing a file's record holds
            self._skip = padded
            return
        if kind in (b"L", b"x"):
            if size > _META_MAX:
                self.done = True
                return
            if kind == b"x":
                self._pax = {}  # only the records just before an entry are its own: none pile up
            self._meta, self._meta_kind, self._meta_left = bytearray(), kind, size
            self._skip_after_meta = padded - size
            if not size:
                self._end_meta()
            return
        name = _text(block[0:100])
        if block[257:263] == b"ustar\0" and block[345] != 0:  # POSIX: a prefix of the name
            name = _text(block[345:500]) + "/" + name
        if self._long_name is not None:
            name = self._long_name
        name = self._pax.get("path", name)
        if "size" in self._pax:
            try:
                size = int(self._pax["size"])
            except ValueError:
                size = -1
            if size < 0:
                self.done = True
                return
            padded = size + (-size % 512)
        self._long_name, self._pax = None, {}
        if kind in _REGULAR:
            self._on_file(name.removeprefix("./"), size, (_number(block[100:108]) or 0) & 0o7777)
        self._skip = padded if kind not in (b"1", b"2", b"3", b"4", b"5", b"6") else 0

    def _end_meta(self) -> None:
        data, kind = bytes(self._meta or b""), self._meta_kind
        self._meta = None
        self._skip = self._skip_after_meta
        if kind == b"L":
            self._long_name = _text(data.split(b"\0", 1)[0])
            return
        pos = 0
        while pos < len(data):  # "<length> <key>=<value>\n", the length counting itself
            space = data.find(b" ", pos)
            try:
                length = int(data[pos:space])
            except ValueError:
                self.done = True
                return
            if space < 0 or length <= 0:
                self.done = True
                return
            key, _, value = data[space + 1:pos + length - 1].partition(b"=")
            self._pax[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
            pos += length


class GzipTarHeaders:
    """``TarHeaders`` over a gzipped tar's bytes, inflated a bounded slice at a time (a small
    upload that inflates to terabytes is read only as far as its headers are wanted). Bytes
    that are no gzip end the watch quietly, as an unreadable header does."""

    def __init__(self, headers: TarHeaders) -> None:
        self.headers = headers
        self._gz: zlib._Decompress | None = zlib.decompressobj(31)

    def feed(self, data: bytes) -> None:
        gz = self._gz
        if gz is None or self.headers.done:
            return
        try:
            while data and not self.headers.done:
                self.headers.feed(gz.decompress(data, 1 << 20))
                data = gz.unconsumed_tail
                if gz.eof:  # gzip readers go on to the next member: so does the watch
                    data, gz = gz.unused_data, zlib.decompressobj(31)
                    self._gz = gz
        except zlib.error:
            self._gz = None


def _checksum_ok(block: bytes) -> bool:
    stored = _number(block[148:156])
    rest = block[:148] + block[156:]  # the checksum field counts as eight spaces
    unsigned = sum(rest) + 8 * 32
    signed = sum(b - 256 if b >= 128 else b for b in rest) + 8 * 32  # as some old tars sum
    return stored is not None and stored in (unsigned, signed)


def _number(field: bytes) -> int | None:
    if field[:1] in (b"\x80", b"\xff"):  # base-256 (GNU), for sizes past 8 GiB
        value = int.from_bytes(field[1:], "big")
        return value if field[0] == 0x80 else None
    text = field.split(b"\0", 1)[0].strip()
    try:
        return int(text, 8) if text else 0
    except ValueError:
        return None


def _text(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
