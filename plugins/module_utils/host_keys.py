# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fleet's known_hosts, as a pure core: parse, fingerprint, and decide learn / keep / refuse.

Entries are keyed by the node's name (ssh's HostKeyAlias), so the one name a node has is also the name its key
is filed under, whatever address it answers on. The rule is ssh's accept-new: an unknown key is learned, a
known key must match, a changed key is refused. The risk guarded against is a substituted machine, not a new one.
"""

from __future__ import annotations

import base64
import hashlib

LEARN = "learn"
KEEP = "keep"
CHANGED = "changed"


class HostKeyChanged(Exception):
    def __init__(self, name, known_fingerprint, offered_fingerprint, known_hosts_path):
        self.name = name
        self.known_fingerprint = known_fingerprint
        self.offered_fingerprint = offered_fingerprint
        super().__init__(
            f"host key of {name} changed: the fleet knows {known_fingerprint}, the machine now offers "
            f"{offered_fingerprint}. Either {name} was substituted, or it was rebuilt outside this "
            "collection. If you rebuilt it on purpose, remove "
            f"the old entry (ssh-keygen -R {name} -f {known_hosts_path}) or rebuild it with "
            "llmgw.fleet.provision_node (rebuild=true), which does so itself.")


def fingerprint(key_line):
    """SHA256 fingerprint as ssh-keygen -l prints it, from 'TYPE BASE64 [comment]' or a known_hosts line."""
    fields = key_line.split()
    blob = next(f for f in fields if f.startswith("AAAA"))
    digest = hashlib.sha256(base64.b64decode(blob)).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


class BadPublicKey(ValueError):
    """Text that is not an OpenSSH public key line."""


def _wire_strings(blob):
    """The SSH wire-format strings a key blob consists of; None when they do not fill it exactly (a cut key)."""
    strings = []
    offset = 0
    while offset < len(blob):
        length = int.from_bytes(blob[offset:offset + 4], "big")
        if offset + 4 + length > len(blob):
            return None
        strings.append(blob[offset + 4:offset + 4 + length])
        offset += 4 + length
    return strings


def public_key(text, keytype="ssh-ed25519"):
    """'TYPE BASE64' from the contents of a host's ``ssh_host_*_key.pub`` (as read through the guest agent).

    Raises BadPublicKey when the text holds no key of ``keytype`` (None: of any type) or its blob does not decode
    to that type."""
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 2 and not fields[0].startswith("#") and fields[0] == (keytype or fields[0]):
            keytype = fields[0]
            try:
                blob = base64.b64decode(fields[1], validate=True)
            except (ValueError, TypeError):
                break
            strings = _wire_strings(blob)
            if strings and strings[0] == keytype.encode():
                return "{} {}".format(fields[0], fields[1])
            break
    raise BadPublicKey("not an {} public key: {!r}".format(keytype or "OpenSSH", text.strip()[:120]))


def known_hosts_line(name, offered_key):
    """The line filed for ``name`` (ssh's HostKeyAlias) with the key 'TYPE BASE64'."""
    keytype, blob = offered_key.split()[:2]
    return f"{name} {keytype} {blob}\n"


def parse_known_hosts(text):
    """{host pattern: [(keytype, base64)]} for plain (unhashed) entries; comments and markers are skipped."""
    entries = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 3 or fields[0].startswith(("#", "@", "|")):
            continue
        for host in fields[0].split(","):
            entries.setdefault(host, []).append((fields[1], fields[2]))
    return entries


def decide(known_text, name, offered_key, known_hosts_path="known_hosts"):
    """LEARN or KEEP for the key `name` offers ('TYPE BASE64'); raises HostKeyChanged on a different key."""
    keytype, blob = offered_key.split()[:2]
    known = [k for k in parse_known_hosts(known_text).get(name, []) if k[0] == keytype]
    if not known:
        return LEARN
    if any(k[1] == blob for k in known):
        return KEEP
    raise HostKeyChanged(name, fingerprint(" ".join(known[0])), fingerprint(offered_key), known_hosts_path)


def add_entry(known_text, name, offered_key):
    prefix = known_text if not known_text or known_text.endswith("\n") else known_text + "\n"
    return prefix + known_hosts_line(name, offered_key)


def remove_entries(known_text, name):
    """known_hosts without any line filed under `name` (what a deliberate rebuild does)."""
    kept = []
    for line in known_text.splitlines(True):
        fields = line.split()
        if fields and not fields[0].startswith("#") and name in fields[0].split(","):
            continue
        kept.append(line)
    return "".join(kept)
