"""Stream ids: derived, not stored. An id is the execution id, the stream, and an HMAC of both
under a server secret, so stream URLs are unguessable capabilities (the client fetches them
without credentials) that the server can check without a lookup."""

from __future__ import annotations

import hashlib
import hmac
import re

_KINDS = {"stdout": "o", "stderr": "e", "audit": "a"}  # only o and e are output streams
_ID = re.compile(r"^stm_(?P<prefix>[a-z]+)(?P<body>[0-9a-z]{26})(?P<kind>[oe])(?P<mac>[0-9a-f]{32})\Z")


class StreamIds:
    def __init__(self, secret: bytes) -> None:
        self._secret = secret

    def derive(self, execution_id: str, stream: str) -> str:
        prefix, _, body = execution_id.partition("_")
        return f"stm_{prefix}{body}{_KINDS[stream]}{self._mac(execution_id, stream)}"

    def _mac(self, execution_id: str, stream: str) -> str:
        return self.sign(f"{execution_id}:{stream}")[:32]

    def sign(self, text: str) -> str:
        """HMAC-SHA256 of ``text`` under the server's secret (other capabilities: snapshot uploads)."""
        # A path or header may carry undecodable bytes (as surrogates): signed as sent.
        return hmac.new(self._secret, text.encode("utf-8", "surrogateescape"), hashlib.sha256).hexdigest()

    def execution_of(self, stream_id: str) -> str | None:
        """The execution (or, for a sandbox's own streams, the sandbox: service/sandbox_streams.py)
        an issued output stream id belongs to (None for any other id)."""
        m = _ID.match(stream_id)
        return f"{m['prefix']}_{m['body']}" if m is not None and self.issued(stream_id) else None

    @staticmethod
    def kind_of(stream_id: str) -> str:
        """"stdout" or "stderr" for a well-formed output stream id."""
        m = _ID.match(stream_id)
        return "stderr" if m is not None and m["kind"] == "e" else "stdout"

    def issued(self, stream_id: str) -> bool:
        """True if this server derived ``stream_id``."""
        m = _ID.match(stream_id)
        if m is None:
            return False
        execution_id = f"{m['prefix']}_{m['body']}"
        stream = "stdout" if m["kind"] == "o" else "stderr"
        return hmac.compare_digest(m["mac"], self._mac(execution_id, stream))
