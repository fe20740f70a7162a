# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)


class ModuleDocFragment:
    # The registry's location, stated once for the fleet modules. gateway_config, the placement lookup and the
    # fleet inventory say more about it and document their own.
    DOCUMENTATION = r"""
options:
  db:
    description:
      - Path of the registry database. Defaults to E(LLMGW_FLEET_DB), then C($XDG_DATA_HOME/llmgw/fleet.db),
        then C(~/.local/share/llmgw/fleet.db).
    type: path
"""
