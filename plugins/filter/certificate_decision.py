# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

from ansible_collections.llmgw.fleet.plugins.module_utils import certificates


def certificate_decision(info, name, address, window_key="renewal_window", force=False, reissue=False):
    """`info` is a registered community.crypto.x509_certificate_info result, or a falsy value when there is none."""
    existing = info if info and not info.get("skipped") and info.get("subject") is not None else None
    valid = bool(((existing or {}).get("valid_at") or {}).get(window_key, True))
    action, reason = certificates.decide(name, address, existing, valid, force, reissue)
    return {"action": action, "reason": reason}


class FilterModule:
    def filters(self):
        return {"certificate_decision": certificate_decision}
