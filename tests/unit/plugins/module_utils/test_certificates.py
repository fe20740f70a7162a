from ansible_collections.llmgw.fleet.plugins.module_utils import certificates as c

INFO = {"subject": {"commonName": "node05"}, "subject_alt_name": ["DNS:node05", "IP:10.77.0.105"]}


def test_no_certificate_is_issued():
    assert c.decide("node05", "10.77.0.105/24", None)[0] == c.ISSUE


def test_matching_valid_certificate_is_kept():
    assert c.decide("node05", "10.77.0.105/24", INFO, valid_through_window=True) == (c.KEEP, "valid and matching")


def test_expiring_or_requested_is_reissued():
    assert c.decide("node05", "10.77.0.105", INFO, valid_through_window=False)[0] == c.REISSUE
    assert c.decide("node05", "10.77.0.105", INFO, reissue=True)[0] == c.REISSUE


def test_identity_mismatch_is_refused_unless_forced():
    action, reason = c.decide("node06", "10.77.0.105", INFO)
    assert action == c.REFUSE
    assert "CN=node05" in reason and "CN=node06" in reason
    assert c.decide("node06", "10.77.0.105", INFO, force=True)[0] == c.REISSUE


def test_ip_address_spelling_from_cryptography_is_understood():
    info = {"subject": {"commonName": "node05"}, "subject_alt_name": ["IP Address:10.77.0.105", "DNS:node05"]}
    assert c.decide("node05", "10.77.0.105", info)[0] == c.KEEP
