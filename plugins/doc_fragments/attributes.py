# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)


class ModuleDocFragment:
    # What check mode and diff mode mean, stated once. A module extends this fragment and gives, under its own
    # attributes, only the support (full, partial, none, N/A) and the details.
    DOCUMENTATION = r"""
options: {}
attributes:
  check_mode:
    description: Can run in check mode and return changed status prediction without modifying target.
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check mode), when in diff mode.
"""

    # A module that only reads (use together with DOCUMENTATION above).
    INFO_MODULE = r"""
options: {}
attributes:
  check_mode:
    support: full
    details: This action reads only; it runs the same in check mode.
  diff_mode:
    support: N/A
    details: This action changes nothing, so there is nothing to diff.
"""
