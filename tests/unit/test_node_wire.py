"""The node agent's wire (drivers/node/wire.py): signing, the hello proof, frames, and the
attacker's requests refused."""

from __future__ import annotations

import pytest

from hutch.core.errors import (
    DriverFailure,
    FileNotFound,
    NoCapacity,
    SandboxNotFound,
    Unauthorized,
    from_wire,
)
from hutch.drivers.node import wire

SECRET = b"s" * 32


def test_a_signed_request_is_accepted_once() -> None:
    v = wire.Verifier(SECRET)
    headers = wire.sign(SECRET, "POST", "/v1/sandboxes/sb-1/exec?x=1", now=1000)
    v.verify("POST", "/v1/sandboxes/sb-1/exec?x=1", headers, now=1001)
    with pytest.raises(Unauthorized, match="replayed"):
        v.verify("POST", "/v1/sandboxes/sb-1/exec?x=1", headers, now=1002)


def test_unsigned_is_refused() -> None:
    with pytest.raises(Unauthorized, match="unsigned"):
        wire.Verifier(SECRET).verify("GET", "/v1/node", {}, now=1000)


def test_wrong_secret_is_refused() -> None:
    headers = wire.sign(b"x" * 32, "GET", "/v1/node", now=1000)
    with pytest.raises(Unauthorized, match="bad signature"):
        wire.Verifier(SECRET).verify("GET", "/v1/node", headers, now=1000)


def test_a_signature_is_for_its_own_method_and_path() -> None:
    headers = wire.sign(SECRET, "GET", "/v1/sandboxes/sb-1/file?path=a", now=1000)
    v = wire.Verifier(SECRET)
    for method, path in (("DELETE", "/v1/sandboxes/sb-1/file?path=a"), ("GET", "/v1/sandboxes/sb-2/file?path=a"),
                         ("GET", "/v1/sandboxes/sb-1/file?path=/etc/shadow")):
        with pytest.raises(Unauthorized, match="bad signature"):
            v.verify(method, path, headers, now=1000)


@pytest.mark.parametrize("skew", [-61, 61])
def test_stale_is_refused(skew: int) -> None:
    headers = wire.sign(SECRET, "GET", "/v1/node", now=1000)
    with pytest.raises(Unauthorized, match="stale"):
        wire.Verifier(SECRET).verify("GET", "/v1/node", headers, now=1000 + skew)


def test_the_nonce_set_is_bounded() -> None:
    v = wire.Verifier(SECRET, max_nonces=10)
    for _ in range(50):
        v.verify("GET", "/v1/node", wire.sign(SECRET, "GET", "/v1/node", now=1000), now=1000)
    assert len(v._seen) == 10
    v.verify("GET", "/v1/node", wire.sign(SECRET, "GET", "/v1/node", now=2000), now=2000)
    assert len(v._seen) == 1  # those past the window are forgotten: they would be refused as stale anyway


def test_hello_proof() -> None:
    cert = "ab" * 32
    answer = {"name": "c1", "instance": "i-1", "fingerprint": cert,
              "proof": wire.hello_proof(SECRET, "n-1", "c1", "i-1", cert)}
    assert wire.check_hello(SECRET, "n-1", answer, cert) == ("c1", "i-1")
    with pytest.raises(Unauthorized, match="could not prove"):
        wire.check_hello(SECRET, "n-2", answer, cert)  # an old answer replayed to a new nonce
    with pytest.raises(Unauthorized, match="could not prove"):
        wire.check_hello(b"y" * 32, "n-1", answer, cert)
    with pytest.raises(Unauthorized, match="lacks"):
        wire.check_hello(SECRET, "n-1", {"name": "c1", "instance": "i-1", "proof": answer["proof"]}, cert)
    # The proof holds, but for a certificate this connection did not present (a man in the
    # middle relaying the real agent's answer), or the fingerprint was swapped on the way.
    with pytest.raises(Unauthorized, match="something between the API and the agent ends TLS"):
        wire.check_hello(SECRET, "n-1", answer, "cd" * 32)
    with pytest.raises(Unauthorized, match="could not prove"):
        wire.check_hello(SECRET, "n-1", {**answer, "fingerprint": "cd" * 32}, "cd" * 32)


def test_short_secret_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 32 bytes"):
        wire.check_secret(b"short", "HUTCH_NODE_SECRET")


def test_frames_round_trip_in_any_split() -> None:
    data = wire.frame(wire.STDOUT, b"out") + wire.frame(wire.STDERR, b"") + wire.json_frame(wire.RESULT, {"exit_code": 3})
    for cut in range(len(data) + 1):
        reader = wire.FrameReader()
        got = reader.feed(data[:cut]) + reader.feed(data[cut:])
        assert got == [(b"o", b"out"), (b"e", b""), (b"x", b'{"exit_code": 3}')]
        assert reader.pending == 0


def test_a_bad_frame_is_refused() -> None:
    with pytest.raises(ValueError, match="bad frame"):
        wire.FrameReader().feed(b"z\x00\x00\x00\x01a")
    with pytest.raises(ValueError, match="bad frame"):
        wire.FrameReader().feed(wire.HEADER.pack(b"o", wire.MAX_FRAME + 1))


def test_errors_come_back_as_their_own_class() -> None:
    assert type(from_wire(404, SandboxNotFound("sandbox x not found").to_wire())) is SandboxNotFound
    err = from_wire(404, FileNotFound("no such file: a", field="path").to_wire())
    assert (type(err), err.message, err.field) == (FileNotFound, "no such file: a", "path")
    assert type(from_wire(502, DriverFailure("boom").to_wire())) is DriverFailure
    assert type(from_wire(503, NoCapacity("full").to_wire())) is NoCapacity
    assert isinstance(from_wire(500, "<html>"), DriverFailure)


def test_a_signature_covers_the_body_marker() -> None:
    headers = wire.sign(SECRET, "POST", "/v1/sandboxes/sb-1/exec", body=wire.body_digest(b'{"argv":["true"]}'), now=1000)
    swapped = {**headers, wire.BODY: wire.body_digest(b'{"argv":["rm","-rf","/"]}')}
    with pytest.raises(Unauthorized, match="bad signature"):
        wire.Verifier(SECRET).verify("POST", "/v1/sandboxes/sb-1/exec", swapped, now=1000)
    assert wire.Verifier(SECRET).verify("POST", "/v1/sandboxes/sb-1/exec", headers, now=1000) == headers[wire.BODY]
    missing = {k: v for k, v in headers.items() if k != wire.BODY}
    with pytest.raises(Unauthorized, match="unsigned"):
        wire.Verifier(SECRET).verify("POST", "/v1/sandboxes/sb-1/exec", missing, now=1000)
