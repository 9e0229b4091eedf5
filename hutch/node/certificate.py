"""The agent's TLS certificate: a fresh self-signed ECDSA P-256 one per process start, so
there is no PKI to run. Nothing trusts it by a chain: the agent's hello proves its SHA-256
fingerprint with the cluster secret and the driver pins that fingerprint (wire.py).

Made with ``cryptography`` where it is installed, else with the ``openssl`` command. The key
is written only to a private temporary directory long enough for ``ssl`` to load it."""

from __future__ import annotations

import datetime
import shutil
import ssl
import subprocess
import tempfile
from pathlib import Path

import attrs

from hutch.drivers.node import wire
from hutch.node.config import SettingError

# Nothing checks it (the pin does), but a certificate must say something; the process's
# certificate lasts as long as the process.
VALID_DAYS = 3650


class CertificateError(SettingError):
    """The agent could not make its certificate; its message is the operator's one line."""


@attrs.frozen
class AgentCertificate:
    context: ssl.SSLContext
    fingerprint: str  # wire.cert_fingerprint of the DER certificate


def _with_cryptography(name: str, directory: Path) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"hutch node {name}")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))  # a driver's clock a little behind
            .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
            .sign(key, hashes.SHA256()))
    (directory / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (directory / "key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                          serialization.NoEncryption()))


def _with_openssl(name: str, directory: Path) -> None:
    openssl = shutil.which("openssl")
    if openssl is None:
        raise CertificateError("hutch node serve needs the Python package 'cryptography' or the 'openssl' command "
                               "to make its TLS certificate; neither is installed")
    argv = [openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-sha256", "-days", str(VALID_DAYS), "-subj", f"/CN=hutch node {name}",
            "-keyout", str(directory / "key.pem"), "-out", str(directory / "cert.pem")]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0:
        raise CertificateError(f"openssl could not make the agent's TLS certificate: {done.stderr.strip()}")


def have_cryptography() -> bool:
    try:
        import cryptography.x509  # noqa: F401
    except ImportError:
        return False
    return True


def make(name: str, *, use_cryptography: bool | None = None) -> AgentCertificate:
    """A new key and certificate, loaded into a server context (TLS 1.2 at least)."""
    use_cryptography = have_cryptography() if use_cryptography is None else use_cryptography
    with tempfile.TemporaryDirectory(prefix="hutch-node-tls-") as tmp:  # 0700, removed on leaving
        directory = Path(tmp)
        (_with_cryptography if use_cryptography else _with_openssl)(name, directory)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(directory / "cert.pem", directory / "key.pem")
        der = ssl.PEM_cert_to_DER_cert((directory / "cert.pem").read_text())
    return AgentCertificate(context=context, fingerprint=wire.cert_fingerprint(der))
