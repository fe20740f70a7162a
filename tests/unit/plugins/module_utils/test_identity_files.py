"""_identity_files: what counts as in place, and why not. Its certificate reading is compared with community.crypto's
x509_certificate_info in tests/e2e/test_identity_role.py."""

from __future__ import annotations

import datetime
import ipaddress
import os

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from cryptography.x509.oid import NameOID

from ansible_collections.llmgw.fleet.plugins.module_utils import _identity_files

NOW = datetime.datetime(2026, 12, 7, tzinfo=datetime.timezone.utc)


def write(path, data, mode):
    with open(path, "wb") as handle:
        handle.write(data)
    os.chmod(path, mode)


def certificate(name, ip, days):
    key = ed25519.Ed25519PrivateKey.generate()
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(1).not_valid_before(NOW - datetime.timedelta(days=1))
            .not_valid_after(NOW + datetime.timedelta(days=days))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(name), x509.IPAddress(ipaddress.ip_address(ip))]),
                           critical=False)
            .sign(key, None))
    return cert, key


def fleet_ca(tmp_path, node="node05", days=365):
    ca = tmp_path / "ca"
    (ca / "nodes" / node).mkdir(parents=True)
    os.chmod(ca, 0o700)
    os.chmod(ca / "nodes" / node, 0o700)
    cert, key = certificate(node, "10.77.0.105", days)
    pem_key = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    write(ca / "ca.key", pem_key, 0o600)
    write(ca / "ca.crt", cert.public_bytes(serialization.Encoding.PEM), 0o644)
    write(ca / "nodes" / node / "node.key", pem_key, 0o600)
    write(ca / "nodes" / node / "node.crt", cert.public_bytes(serialization.Encoding.PEM), 0o644)
    return ca, cert


def test_everything_in_place_is_complete_with_the_certificates_info(tmp_path):
    ca, cert = fleet_ca(tmp_path)
    found = _identity_files.read(str(ca), node="node05", renewal_days=30, now=NOW)
    assert found["ca_complete"] and found["node_complete"] and found["problems"] == []
    info = found["node_cert"]
    assert info["subject"] == {"commonName": "node05"}
    assert info["subject_alt_name"] == ["DNS:node05", "IP:10.77.0.105"]
    assert info["valid_at"] == {"renewal_window": True}
    digest = cert.fingerprint(hashes.SHA256()).hex()
    assert info["fingerprints"]["sha256"] == ":".join(digest[i:i + 2] for i in range(0, 64, 2))


def test_a_certificate_that_ends_inside_the_window_is_read_as_not_valid_there(tmp_path):
    ca, _cert = fleet_ca(tmp_path, days=10)
    assert _identity_files.read(str(ca), "node05", 30, NOW)["node_cert"]["valid_at"] == {"renewal_window": False}
    assert _identity_files.read(str(ca), "node05", 5, NOW)["node_cert"]["valid_at"] == {"renewal_window": True}


def test_each_thing_out_of_place_is_named_and_makes_it_incomplete(tmp_path):
    ca, _cert = fleet_ca(tmp_path)
    node_dir = ca / "nodes" / "node05"
    cases = [
        (lambda: os.chmod(node_dir / "node.key", 0o644), "node.key has mode 0644, not 0600", True),
        (lambda: os.chmod(node_dir, 0o755), "node05 has mode 0755, not 0700", True),
        (lambda: os.remove(node_dir / "node.crt"), "node.crt is not there", True),
        (lambda: write(node_dir / "node.crt", b"not a certificate", 0o644), "cannot be read as a certificate", True),
        (lambda: os.chmod(ca / "ca.key", 0o640), "ca.key has mode 0640, not 0600", False),
        (lambda: os.remove(ca / "ca.crt"), "ca.crt is not there", False),
    ]
    for break_it, problem, ca_stays_complete in cases:
        tmp = tmp_path / str(len(os.listdir(tmp_path)))
        tmp.mkdir()
        ca, _cert = fleet_ca(tmp)
        node_dir = ca / "nodes" / "node05"
        break_it()
        found = _identity_files.read(str(ca), node="node05", now=NOW)
        assert not found["node_complete"], problem
        assert found["ca_complete"] is ca_stays_complete, problem
        assert any(problem in p for p in found["problems"]), (problem, found["problems"])


def test_a_node_without_its_directory_and_a_missing_ca(tmp_path):
    ca, _cert = fleet_ca(tmp_path)
    found = _identity_files.read(str(ca), node="node06", now=NOW)
    assert found["ca_complete"] and not found["node_complete"] and found["node_cert"] is None
    assert any("node06 is not there" in p for p in found["problems"])
    nothing = _identity_files.read(str(tmp_path / "none"))
    assert not nothing["ca_complete"] and not nothing["node_complete"]
    assert len(nothing["problems"]) == 3  # the directory, the key, the certificate
