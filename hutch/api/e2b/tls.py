"""The certificate of E2B's TLS listener (``hutch serve --e2b-tls-port``): E2B's SDK reaches a
sandbox at ``https://{port}-{sandbox id}.{domain}``, so the server needs a certificate for
``*.{domain}``. No public CA issues one for ``*.e2b.localhost``, so the server makes its own CA
once (kept in the data directory: a restart keeps what clients were told to trust) and, at each
start, a leaf for ``*.{domain}`` and ``{domain}`` signed by it. Clients trust the CA's file,
``{data dir}/e2b-tls/ca.pem`` (``SSL_CERT_FILE`` for E2B's SDK, httpx and urllib alike).

The CA's key never leaves the data directory (0600 in a 0700 directory); its certificate is
limited to names under the domain (a name constraint), so whoever takes the file from a
client's trust store cannot use a stolen key for any other name. The leaf's key lives in this
process only (written to a private temporary directory long enough for ``ssl`` to load it)."""

from __future__ import annotations

import datetime
import os
import ssl
import tempfile
from pathlib import Path

CA_DAYS = 3650
LEAF_DAYS = 90  # made anew at each start


def ca_file(data_dir: Path) -> Path:
    return data_dir / "e2b-tls" / "ca.pem"


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)


def server_context(data_dir: Path, domain: str) -> ssl.SSLContext:
    """A server context for ``*.{domain}`` under this server's CA (made on first use)."""
    # Only where the listener runs; service/extras.py refuses the setting at start without it.
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    directory = data_dir / "e2b-tls"
    directory.mkdir(mode=0o700, exist_ok=True)
    os.chmod(directory, 0o700)
    cert_path, key_path = ca_file(data_dir), directory / "ca-key.pem"
    now = datetime.datetime.now(datetime.UTC)
    ca: x509.Certificate | None = None
    if cert_path.exists() and key_path.exists():
        ca = x509.load_pem_x509_certificate(cert_path.read_bytes())
        ca_key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        names = ca.extensions.get_extension_for_class(x509.NameConstraints).value.permitted_subtrees or []
        if [n.value for n in names] != [domain] or ca.not_valid_after_utc < now + datetime.timedelta(days=LEAF_DAYS):
            ca = None  # another domain, or about to end: a new CA (clients must trust the new file)
    if ca is None:
        ca_key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"hutch E2B CA for {domain}")])
        ca = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(ca_key.public_key())
              .serial_number(x509.random_serial_number())
              .not_valid_before(now - datetime.timedelta(hours=1))
              .not_valid_after(now + datetime.timedelta(days=CA_DAYS))
              .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
              .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                           content_commitment=False, key_encipherment=False, data_encipherment=False,
                                           key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
              .add_extension(x509.NameConstraints(permitted_subtrees=[x509.DNSName(domain)], excluded_subtrees=None),
                             critical=True)
              .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
              .sign(ca_key, hashes.SHA256()))
        _write_private(key_path, ca_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                      serialization.NoEncryption()))
        cert_path.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, domain)]))
            .issuer_name(ca.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=LEAF_DAYS))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(f"*.{domain}"), x509.DNSName(domain)]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    with tempfile.TemporaryDirectory(prefix="hutch-e2b-tls-") as tmp:  # 0700, removed on leaving
        chain, private = Path(tmp) / "chain.pem", Path(tmp) / "key.pem"
        chain.write_bytes(leaf.public_bytes(serialization.Encoding.PEM) + ca.public_bytes(serialization.Encoding.PEM))
        _write_private(private, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                  serialization.NoEncryption()))
        context.load_cert_chain(chain, private)
    return context
