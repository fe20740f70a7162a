"""The lab's own CA and the API server's certificate (127.0.0.1, ::1, localhost, pve), under `.lab/pki/`.

Clients verify the server against `ca.pem` (connection.yml's `ca_cert`); nothing needs `verify=False`. Existing
files are kept while they are valid, so a CA a user has trusted stays the same across `up`/`down`.
"""

from __future__ import annotations

import datetime
import ipaddress
import os

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from pve_lab.api.constants import NODE, LabPaths

CA_DAYS = 3650
SERVER_DAYS = 825
RENEW_BEFORE = datetime.timedelta(days=30)
SERVER_NAMES = ["localhost", NODE]
SERVER_ADDRESSES = ["127.0.0.1", "::1"]


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def _write_key(path: str, key) -> None:
    data = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())
    fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.replace(path + ".tmp", path)


def _write_cert(path: str, cert: x509.Certificate) -> None:
    with open(path + ".tmp", "wb") as handle:
        handle.write(cert.public_bytes(serialization.Encoding.PEM))
    os.replace(path + ".tmp", path)


def _load(paths: LabPaths, cert_path: str, key_path: str):
    if not (os.path.exists(cert_path) and os.path.exists(key_path)):
        return None, None
    with open(cert_path, "rb") as handle:
        cert = x509.load_pem_x509_certificate(handle.read())
    with open(key_path, "rb") as handle:
        key = serialization.load_pem_private_key(handle.read(), password=None)
    return cert, key


def _fresh(cert: x509.Certificate) -> bool:
    return cert.not_valid_after_utc - _now() > RENEW_BEFORE


def _create_ca(paths: LabPaths):
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "llmgw lab"),
                      x509.NameAttribute(NameOID.COMMON_NAME, "llmgw lab CA")])
    now = _now()
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(CA_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                         crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    _write_key(paths.ca_key, key)
    _write_cert(paths.ca_cert, cert)
    return cert, key


def _create_server(paths: LabPaths, ca_cert: x509.Certificate, ca_key) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    names = [x509.DNSName(n) for n in SERVER_NAMES] + [x509.IPAddress(ipaddress.ip_address(a))
                                                       for a in SERVER_ADDRESSES]
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "llmgw lab"),
                                     x509.NameAttribute(NameOID.COMMON_NAME, NODE)]))
            .issuer_name(ca_cert.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(SERVER_DAYS))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=False,
                                         crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    _write_key(paths.server_key, key)
    _write_cert(paths.server_cert, cert)


def _issued_by(cert: x509.Certificate, ca_cert: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca_cert)
        return True
    except (ValueError, TypeError, InvalidSignature):
        return False


def ensure(paths: LabPaths) -> bool:
    """Creates whatever is missing, expiring or no longer matching; returns whether anything was (re)made."""
    os.makedirs(paths.pki_dir, mode=0o700, exist_ok=True)
    ca_cert, ca_key = _load(paths, paths.ca_cert, paths.ca_key)
    made = False
    if ca_cert is None or not _fresh(ca_cert):
        ca_cert, ca_key = _create_ca(paths)
        made = True
    server_cert, _ignored = _load(paths, paths.server_cert, paths.server_key)
    if made or server_cert is None or not _fresh(server_cert) or not _issued_by(server_cert, ca_cert):
        _create_server(paths, ca_cert, ca_key)
        made = True
    return made
