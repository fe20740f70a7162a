import subprocess

import pytest

from ansible_collections.llmgw.fleet.plugins.module_utils import host_keys


def make_key(tmp_path, name):
    path = tmp_path / name
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return (tmp_path / (name + ".pub")).read_text().strip()


def test_fingerprint_matches_ssh_keygen(tmp_path):
    key = make_key(tmp_path, "k")
    printed = subprocess.run(["ssh-keygen", "-l", "-f", str(tmp_path / "k.pub")], capture_output=True, text=True,
                             check=True).stdout.split()[1]
    assert host_keys.fingerprint(key) == printed


def test_unknown_key_is_learned_and_then_kept(tmp_path):
    key = make_key(tmp_path, "k")
    assert host_keys.decide("", "node05", key) == host_keys.LEARN
    known = host_keys.add_entry("", "node05", key)
    assert host_keys.decide(known, "node05", key) == host_keys.KEEP


def test_changed_key_is_refused_with_both_fingerprints_and_the_fix(tmp_path):
    old, new = make_key(tmp_path, "old"), make_key(tmp_path, "new")
    known = host_keys.add_entry("", "node05", old)
    with pytest.raises(host_keys.HostKeyChanged) as caught:
        host_keys.decide(known, "node05", new, "/fleet/known_hosts")
    message = str(caught.value)
    assert host_keys.fingerprint(old) in message and host_keys.fingerprint(new) in message
    assert "node05" in message and "ssh-keygen -R node05 -f /fleet/known_hosts" in message


def test_other_nodes_entries_do_not_count(tmp_path):
    key, other = make_key(tmp_path, "k"), make_key(tmp_path, "o")
    known = host_keys.add_entry("", "node06", other)
    assert host_keys.decide(known, "node05", key) == host_keys.LEARN


def test_remove_entries_forgets_only_that_node(tmp_path):
    a, b = make_key(tmp_path, "a"), make_key(tmp_path, "b")
    known = host_keys.add_entry(host_keys.add_entry("# fleet\n", "node05", a), "node06", b)
    left = host_keys.remove_entries(known, "node05")
    assert "node05" not in host_keys.parse_known_hosts(left)
    assert "node06" in host_keys.parse_known_hosts(left)
    assert left.startswith("# fleet\n")


def test_public_key_reads_a_host_key_file_as_the_agent_returns_it(tmp_path):
    key = make_key(tmp_path, "host")
    keytype, blob = key.split()[:2]
    assert host_keys.public_key(key + "\n") == keytype + " " + blob
    assert host_keys.public_key("# comment\n" + key) == keytype + " " + blob


def test_public_key_refuses_what_is_no_key_of_that_type(tmp_path):
    key = make_key(tmp_path, "host")
    keytype, blob = key.split()[:2]
    for text in ("", "cat: /etc/ssh/ssh_host_ed25519_key.pub: No such file or directory",
                 keytype + " not-base64!", "ssh-rsa " + blob, keytype + " " + blob[:-8]):
        with pytest.raises(host_keys.BadPublicKey):
            host_keys.public_key(text)


def test_public_key_of_any_type_takes_the_type_from_the_text(tmp_path):
    key = make_key(tmp_path, "host")
    assert host_keys.public_key(key, keytype=None) == " ".join(key.split()[:2])
    with pytest.raises(host_keys.BadPublicKey):
        host_keys.public_key("ssh-rsa " + key.split()[1], keytype=None)


def test_known_hosts_line_is_what_add_entry_appends_and_parse_reads(tmp_path):
    key = make_key(tmp_path, "k")
    line = host_keys.known_hosts_line("node05", key)
    assert line.endswith("\n") and host_keys.add_entry("", "node05", key) == line
    assert host_keys.parse_known_hosts(line) == {"node05": [tuple(key.split()[:2])]}
