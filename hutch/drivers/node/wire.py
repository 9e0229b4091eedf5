"""What the node driver and its agents (``hutch node serve``) share on the wire.

- **Signing**: every request but ``GET /healthz`` carries ``X-Hutch-Ts`` (unix seconds),
  ``X-Hutch-Nonce`` and ``X-Hutch-Sig`` = HMAC-SHA256 of the cluster secret over method,
  path with query, ts and nonce. The agent refuses a missing or wrong signature, a ts outside
  ``WINDOW`` seconds and a nonce it has seen inside the window: a request overheard cannot
  be sent again, and a sandbox that reaches an agent without the secret can do nothing.
  ``X-Hutch-Body`` is signed too: the SHA-256 of the body (JSON bodies and empty ones, which
  the agent checks), or ``stream`` for the few routes whose body is streamed (file and tar
  uploads, stdin), which the agent allows on those routes only.
- **TLS**: the agent serves HTTPS (and wss) with a self-signed certificate made at its start
  (hutch/node/certificate.py). Nothing trusts it by a chain: the hello proves its fingerprint.
- **Hello proof**: the driver sends a fresh nonce; the agent answers its name, its instance id
  (random per process start), its certificate's SHA-256 fingerprint and an HMAC over the four,
  proving it holds the secret, so a process squatting on an agent's address cannot take
  sandboxes. The driver checks the fingerprint against the certificate of the connection the
  hello came on (a man in the middle presents its own) and pins both: every later connection
  must present that certificate, and a different instance means the agent restarted.
- **Frames** for streamed answers (exec output): 1 type byte + 4-byte big-endian length +
  payload: ``o`` stdout, ``e`` stderr, ``x`` the result (JSON, last), ``!`` an error (JSON, last).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import struct
import time
from collections import OrderedDict
from typing import Any

from hutch.core.errors import Unauthorized

WINDOW = 60.0  # seconds a signed request stays valid either side of the agent's clock
MAX_NONCES = 100_000  # remembered nonces: a flood of fresh ones evicts the oldest, never grows memory
MIN_SECRET = 32  # bytes

TS, NONCE, SIG, BODY = "X-Hutch-Ts", "X-Hutch-Nonce", "X-Hutch-Sig", "X-Hutch-Body"
STREAM = "stream"  # X-Hutch-Body of a streamed body


def body_digest(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


EMPTY = body_digest(b"")

HEADER = struct.Struct(">cI")
STDOUT, STDERR, RESULT, ERROR = b"o", b"e", b"x", b"!"
MAX_FRAME = 16 << 20  # a frame longer than this is a broken or hostile peer, not output


def check_secret(secret: bytes, where: str) -> bytes:
    if len(secret) < MIN_SECRET:
        raise ValueError(f"{where}: the node secret must be at least {MIN_SECRET} bytes (got {len(secret)})")
    return secret


def _mac(secret: bytes, *parts: str) -> str:
    return hmac.new(secret, "\n".join(parts).encode(), hashlib.sha256).hexdigest()


def sign(secret: bytes, method: str, path_qs: str, *, body: str = EMPTY, now: float | None = None) -> dict[str, str]:
    """The headers that make one request (``path_qs``: path and query as sent; ``body``: its
    body's digest, or STREAM) acceptable once."""
    ts = str(int(now if now is not None else time.time()))
    nonce = secrets.token_hex(16)
    return {TS: ts, NONCE: nonce, BODY: body, SIG: _mac(secret, method.upper(), path_qs, ts, nonce, body)}


class Verifier:
    """The agent's side of signing: each signed request accepted once, inside the window."""

    def __init__(self, secret: bytes, *, window: float = WINDOW, max_nonces: int = MAX_NONCES) -> None:
        self._secret = secret
        self._window = window
        self._max = max_nonces
        self._seen: OrderedDict[str, float] = OrderedDict()

    def verify(self, method: str, path_qs: str, headers: Any, *, now: float | None = None) -> str:
        """Refuses what is not signed, stale or replayed; returns the signed body marker (a
        digest the body must match, or STREAM)."""
        now = now if now is not None else time.time()
        ts, nonce, sig, body = headers.get(TS), headers.get(NONCE), headers.get(SIG), headers.get(BODY)
        if not ts or not nonce or not sig or not body:
            raise Unauthorized("unsigned request: the node agent answers signed requests only")
        try:
            at = float(ts)
        except ValueError:
            raise Unauthorized(f"bad {TS} header") from None
        if not hmac.compare_digest(sig, _mac(self._secret, method.upper(), path_qs, ts, nonce, body)):
            raise Unauthorized("bad signature: the request was not signed with this cluster's node secret")
        if abs(now - at) > self._window:
            raise Unauthorized(f"stale request: signed {now - at:.0f} s from the agent's clock (window {self._window:.0f} s)")
        self._expire(now)
        if nonce in self._seen:
            raise Unauthorized("replayed request: this nonce was already used")
        self._seen[nonce] = at
        while len(self._seen) > self._max:
            self._seen.popitem(last=False)
        return str(body)

    def _expire(self, now: float) -> None:
        while self._seen:
            nonce, at = next(iter(self._seen.items()))
            if now - at <= self._window:
                break
            del self._seen[nonce]


def cert_fingerprint(der: bytes) -> str:
    """The SHA-256 of a certificate (DER), in hex: what the hello proves and the driver pins."""
    return hashlib.sha256(der).hexdigest()


def hello_proof(secret: bytes, nonce: str, name: str, instance: str, fingerprint: str) -> str:
    return _mac(secret, "hello", nonce, name, instance, fingerprint)


def check_hello(secret: bytes, nonce: str, answer: dict[str, Any], seen: str) -> tuple[str, str]:
    """(name, instance) of an agent's hello answer, once its proof holds for ``seen``: the
    fingerprint of the certificate the answer's connection presented."""
    name, instance, proof = answer.get("name"), answer.get("instance"), answer.get("proof")
    claimed = answer.get("fingerprint")
    if not all(isinstance(v, str) for v in (name, instance, proof, claimed)):
        raise Unauthorized("the node agent's hello answer lacks name, instance, fingerprint or proof")
    assert isinstance(name, str) and isinstance(instance, str) and isinstance(proof, str) and isinstance(claimed, str)
    if not hmac.compare_digest(proof, hello_proof(secret, nonce, name, instance, claimed)):
        raise Unauthorized(f"the node agent calling itself {name!r} could not prove it holds the cluster's node secret")
    if not hmac.compare_digest(claimed, seen):
        # The agent is real, the connection is not to it: something in between ended TLS.
        raise Unauthorized(f"the node agent {name!r} proved certificate {claimed[:16]}…, but the connection "
                           f"presented {seen[:16]}…: something between the API and the agent ends TLS")
    return name, instance


def frame(kind: bytes, payload: bytes) -> bytes:
    return HEADER.pack(kind, len(payload)) + payload


def json_frame(kind: bytes, value: Any) -> bytes:
    return frame(kind, json.dumps(value).encode())


class FrameReader:
    """Frames out of a byte stream, fed as it arrives."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[tuple[bytes, bytes]]:
        self._buf += data
        out: list[tuple[bytes, bytes]] = []
        while len(self._buf) >= HEADER.size:
            kind, length = HEADER.unpack_from(self._buf)
            if length > MAX_FRAME or kind not in (STDOUT, STDERR, RESULT, ERROR):
                raise ValueError(f"bad frame from the node agent (type {kind!r}, {length} bytes)")
            if len(self._buf) < HEADER.size + length:
                break
            out.append((kind, bytes(self._buf[HEADER.size:HEADER.size + length])))
            del self._buf[:HEADER.size + length]
        return out

    @property
    def pending(self) -> int:
        return len(self._buf)
