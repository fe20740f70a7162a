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
    keytype, blob = offered_key.split()[:2]
    prefix = known_text if not known_text or known_text.endswith("\n") else known_text + "\n"
    return prefix + f"{name} {keytype} {blob}\n"


def remove_entries(known_text, name):
    """known_hosts without any line filed under `name` (what a deliberate rebuild does)."""
    kept = []
    for line in known_text.splitlines(True):
        fields = line.split()
        if fields and not fields[0].startswith("#") and name in fields[0].split(","):
            continue
        kept.append(line)
    return "".join(kept)
