"""The identity role on the controller: a CA created once, node certificates never re-issued by accident.

check -> apply -> check -> apply, then every way a certificate may or may not be re-issued, with real
community.crypto and real ansible-playbook.
"""

import hashlib
import os

import pytest
from cryptography import x509
from cryptography.x509.oid import NameOID
from helpers import run_playbook

PLAY = """
- hosts: localhost
  connection: local
  gather_facts: false
  roles:
    - role: llmgw.fleet.identity
"""


@pytest.fixture
def playbook(tmp_path):
    path = tmp_path / "identity.yml"
    path.write_text(PLAY)
    return str(path)


def run(playbook, tmp_path, check=False, **extra):
    extra_vars = dict(identity_node="node05", identity_address="10.77.0.105/24", identity_ca_dir=str(tmp_path / "ca"))
    extra_vars.update(extra)
    return run_playbook(playbook, extra_vars, check=check)


def digest(path):
    with open(path, "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()


def cert(tmp_path):
    return tmp_path / "ca" / "nodes" / "node05" / "node.crt"


def test_check_apply_check_apply(playbook, tmp_path):
    first_check = run(playbook, tmp_path, check=True)
    assert not first_check.failed, first_check.failure_messages()
    assert first_check.changed > 0
    assert not (tmp_path / "ca" / "ca.key").exists(), "check mode created the CA"

    applied = run(playbook, tmp_path)
    assert not applied.failed, applied.failure_messages()
    assert applied.changed > 0
    loaded = x509.load_pem_x509_certificate(cert(tmp_path).read_bytes())
    assert loaded.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "node05"
    sans = loaded.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["node05"]
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["10.77.0.105"]
    assert oct(os.stat(tmp_path / "ca" / "ca.key").st_mode & 0o777) == "0o600"
    assert oct(os.stat(tmp_path / "ca" / "nodes" / "node05" / "node.key").st_mode & 0o777) == "0o600"

    before = {p: digest(p) for p in (cert(tmp_path), tmp_path / "ca" / "ca.crt", tmp_path / "ca" / "ca.key")}
    second_check = run(playbook, tmp_path, check=True)
    assert not second_check.failed and second_check.changed == 0
    second = run(playbook, tmp_path)
    assert not second.failed and second.changed == 0
    assert before == {p: digest(p) for p in before}, "a second run changed the CA or the certificate"


def test_changed_identity_is_refused_and_nothing_is_touched(playbook, tmp_path):
    assert not run(playbook, tmp_path).failed
    before = digest(cert(tmp_path))
    refused = run(playbook, tmp_path, identity_address="10.77.0.106/24")
    assert refused.failed
    message = " ".join(refused.failure_messages())
    assert "IP:10.77.0.105" in message and "IP:10.77.0.106" in message and "identity_force=true" in message
    assert digest(cert(tmp_path)) == before


def test_forced_identity_change_reissues_and_keeps_a_backup(playbook, tmp_path):
    assert not run(playbook, tmp_path).failed
    forced = run(playbook, tmp_path, identity_address="10.77.0.106/24", identity_force=True)
    assert not forced.failed, forced.failure_messages()
    loaded = x509.load_pem_x509_certificate(cert(tmp_path).read_bytes())
    sans = loaded.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["10.77.0.106"]
    backups = [n for n in os.listdir(cert(tmp_path).parent) if n.startswith("node.crt.") and n != "node.crt"]
    assert backups, "the old certificate was not kept"


def test_renewal_window_and_explicit_request_reissue_but_the_ca_stays(playbook, tmp_path):
    assert not run(playbook, tmp_path, identity_valid_days=10).failed
    ca_before = digest(tmp_path / "ca" / "ca.crt"), digest(tmp_path / "ca" / "ca.key")
    first = digest(cert(tmp_path))
    inside_window = run(playbook, tmp_path, identity_renewal_days=30)
    assert not inside_window.failed and inside_window.changed > 0
    renewed = digest(cert(tmp_path))
    assert renewed != first
    assert run(playbook, tmp_path).changed == 0
    requested = run(playbook, tmp_path, identity_reissue=True)
    assert not requested.failed and digest(cert(tmp_path)) != renewed
    assert ca_before == (digest(tmp_path / "ca" / "ca.crt"), digest(tmp_path / "ca" / "ca.key"))


def test_a_rerun_puts_back_a_changed_mode_and_keeps_the_certificate(playbook, tmp_path):
    """The re-run's in-process read (identity_files) finds a key or directory with another mode and hands it to the
    modules, which put the mode back; nothing is issued again."""
    assert not run(playbook, tmp_path).failed
    node_key, node_dir = tmp_path / "ca" / "nodes" / "node05" / "node.key", tmp_path / "ca" / "nodes" / "node05"
    before = digest(cert(tmp_path)), digest(node_key)
    for path, mode in ((node_key, 0o644), (node_dir, 0o755), (tmp_path / "ca" / "ca.key", 0o640)):
        os.chmod(path, mode)
        predicted = run(playbook, tmp_path, check=True)
        assert not predicted.failed and predicted.changed > 0, (path, predicted.failure_messages())
        fixed = run(playbook, tmp_path)
        assert not fixed.failed and fixed.changed > 0, (path, fixed.failure_messages())
        assert os.stat(path).st_mode & 0o777 == (0o700 if path.is_dir() else 0o600), path
        assert run(playbook, tmp_path).changed == 0
    assert (digest(cert(tmp_path)), digest(node_key)) == before


COMPARE = """
- hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: What community.crypto reads
      community.crypto.x509_certificate_info:
        path: "{{ cert }}"
        valid_at:
          renewal_window: "+{{ days }}d"
      register: info
    - name: What identity_files reads
      ansible.builtin.set_fact:
        found: "{{ lookup('llmgw.fleet.identity_files', ca_dir, node='node05', renewal_days=days | int) }}"
    - name: The same, for every part the identity role reads
      ansible.builtin.assert:
        that:
          - found.node_complete
          - found.node_cert.subject.commonName == info.subject.commonName
          - found.node_cert.subject_alt_name == info.subject_alt_name
          - found.node_cert.not_after == info.not_after
          - found.node_cert.valid_at.renewal_window == info.valid_at.renewal_window
          - found.node_cert.valid_at.renewal_window == expect_valid | bool
          - found.node_cert.fingerprints.sha256 == info.fingerprints.sha256
"""


@pytest.mark.parametrize("days, valid", [(30, False), (5, True)])
def test_identity_files_reads_a_certificate_as_x509_certificate_info_does(playbook, tmp_path, days, valid):
    assert not run(playbook, tmp_path, identity_valid_days=10, identity_renewal_days=1).failed
    compare = tmp_path / "compare.yml"
    compare.write_text(COMPARE)
    checked = run_playbook(str(compare), {"cert": str(cert(tmp_path)), "ca_dir": str(tmp_path / "ca"), "days": days,
                                          "expect_valid": valid})
    assert not checked.failed, checked.failure_messages()
