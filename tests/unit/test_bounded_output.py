"""What ``hutch mcp`` keeps of a command's output (hutch/_bounded.py): cut at its bound, never
in the middle of a character (a model read a U+FFFD that the command never wrote)."""

from __future__ import annotations

import pytest

from hutch._bounded import Kept


@pytest.mark.parametrize("text", ["abcé", "ab€", "a😀", "日本語"])
def test_a_cut_never_splits_a_character(text: str) -> None:
    data = text.encode()
    for limit in range(1, len(data)):
        kept = Kept(limit)
        for byte in data:  # however the chunks fall
            kept(bytes([byte]))
        said = kept.text("stdout")
        head, _, tail = said.partition("[hutch: ")
        assert "\ufffd" not in said, (limit, said)
        assert data.startswith(head.rstrip("\n").encode()), (limit, said)
        assert tail == f"{len(data) - len(head.rstrip(chr(10)).encode())} more bytes of stdout not kept]\n", said


def test_what_is_not_cut_is_kept_as_written() -> None:
    kept = Kept(10)
    kept("é\n".encode())
    assert kept.text("stdout") == "é\n"
    bad = Kept(10)
    bad(b"\xff\xfe")  # not UTF-8: shown replaced, as a whole output is
    assert bad.text("stdout") == "\ufffd\ufffd"
