"""Certificate authorities an operator adds to every sandbox's trust store.

Behind a TLS-inspecting proxy (many companies' outbound traffic) a sandbox trusts nothing it
reaches until the proxy's CA is added: pip fails with CERTIFICATE_VERIFY_FAILED. With
``HUTCH_SANDBOX_CA_CERTS`` naming a PEM file of one or more certificates, every sandbox's system
bundle (Debian's ``/etc/ssl/certs/ca-certificates.crt``: every runtime is Debian) holds them
after the runtime's own, read-only to the sandbox, and the variables that tools with bundles of
their own read point at it (Python's ssl and requests, pip, Node.js, curl, git).
"""

from __future__ import annotations

import os
from pathlib import Path

SETTING = "HUTCH_SANDBOX_CA_CERTS"
BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
# Each names the whole bundle: NODE_EXTRA_CA_CERTS adds to Node's own roots; the others replace.
ENV = {name: BUNDLE for name in ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "PIP_CERT", "NODE_EXTRA_CA_CERTS",
                                 "CURL_CA_BUNDLE", "GIT_SSL_CAINFO")}
_PEM_BEGIN = b"-----BEGIN CERTIFICATE-----"

_cache: tuple[tuple[str, float], bytes] | None = None


def read_certs(path: str) -> bytes:
    """The PEM certificates in ``path``; a ValueError names the setting and what is wrong."""
    try:
        data = Path(path).read_bytes()
    except OSError as err:
        raise ValueError(f"{SETTING}: cannot read {path}: {err.strerror}") from None
    if _PEM_BEGIN not in data:
        raise ValueError(f"{SETTING}: {path} holds no PEM certificate ('{_PEM_BEGIN.decode()}')")
    return data if data.endswith(b"\n") else data + b"\n"


def extra_certs() -> bytes | None:
    """The operator's certificates (re-read when the file changes), or None when none are set."""
    global _cache
    path = os.environ.get(SETTING)
    if not path:
        return None
    key = (path, os.stat(path).st_mtime)
    if _cache is None or _cache[0] != key:
        _cache = (key, read_certs(path))
    return _cache[1]


def sandbox_env() -> dict[str, str]:
    """The variables every command gets when extra certificates are set."""
    return dict(ENV) if extra_certs() is not None else {}


def bundle(runtime_bundle: bytes) -> bytes:
    """The runtime's bundle with the operator's certificates after it."""
    extra = extra_certs() or b""
    head = runtime_bundle if not runtime_bundle or runtime_bundle.endswith(b"\n") else runtime_bundle + b"\n"
    return head + extra
