# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""When a node's certificate may be (re-)issued: a pure decision, so no run re-issues one by accident.

A certificate is issued when there is none. It is re-issued only when it expires inside the renewal window, on
explicit request, or when its identity no longer matches the node and the operator forces it; an identity
mismatch without force is refused, naming both identities, because it means the name or address given now is
not the one the fleet knows.
"""

from __future__ import annotations

KEEP = "keep"
ISSUE = "issue"
REISSUE = "reissue"
REFUSE = "refuse"


def wanted_identity(name, address):
    ip = address.split("/")[0]
    return {"common_name": name, "subject_alt_name": sorted(["DNS:" + name, "IP:" + ip])}


def existing_identity(info):
    """The identity of a certificate as community.crypto.x509_certificate_info returns it."""
    sans = []
    for san in info.get("subject_alt_name") or []:
        kind, _ignored, value = san.partition(":")
        sans.append("{}:{}".format("IP" if kind in ("IP", "IP Address") else kind, value))
    return {"common_name": (info.get("subject") or {}).get("commonName"), "subject_alt_name": sorted(sans)}


def decide(name, address, info=None, valid_through_window=True, force=False, reissue=False):
    """(action, reason). `info` is None when there is no certificate yet; `valid_through_window` is False when
    it expires inside the renewal window."""
    want = wanted_identity(name, address)
    if info is None:
        return ISSUE, "no certificate for {} yet".format(name)
    have = existing_identity(info)
    if have != want:
        if not force:
            return REFUSE, (
                "the certificate on file is for CN={} {} but the node is CN={} {}: one name and one address per "
                "node. If {} was really renamed or re-addressed, run again with force (the old certificate is kept "
                "as a backup)".format(have["common_name"], ", ".join(have["subject_alt_name"]),
                                      want["common_name"], ", ".join(want["subject_alt_name"]), name))
        return REISSUE, "identity changed and force was given"
    if reissue:
        return REISSUE, "re-issue requested"
    if not valid_through_window:
        return REISSUE, "expires inside the renewal window"
    return KEEP, "valid and matching"
