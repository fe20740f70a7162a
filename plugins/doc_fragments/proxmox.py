# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)


class ModuleDocFragment:
    # Connection options of every llmgw.fleet module that talks to the Proxmox VE API.
    DOCUMENTATION = r"""
options:
  api_host:
    description:
      - Host name or address of the Proxmox VE API.
      - Read from E(PROXMOX_HOST) when not given; one of the two is required.
    type: str
  api_port:
    description:
      - Port of the API. Defaults to V(8006).
      - Read from E(PROXMOX_PORT) when not given.
    type: int
  api_user:
    description:
      - User to authenticate as, with realm, for example V(root@pam).
      - Read from E(PROXMOX_USER) when not given.
      - May be left out when O(api_token_id) is given whole (V(user@realm!tokenname)).
    type: str
  api_password:
    description:
      - Password of O(api_user). Used when no API token is given.
      - Read from E(PROXMOX_PASSWORD) when not given.
    type: str
  api_token_id:
    description:
      - API token name (V(tokenname)) or full token id (V(user@realm!tokenname)).
      - Read from E(PROXMOX_TOKEN_ID) when not given. A token wins over a password.
    type: str
  api_token_secret:
    description:
      - Secret (UUID) of the API token.
      - Read from E(PROXMOX_TOKEN_SECRET) when not given.
    type: str
  validate_certs:
    description:
      - Verify the API's TLS certificate. Keep V(true) and point O(ca_path) at the CA that signed it;
        V(false) is for throwaway labs only, and every run with it warns.
    type: bool
    default: true
  ca_path:
    description:
      - PEM file of the CA (or bundle) to verify the API certificate against, instead of the system store.
      - Read from E(PROXMOX_CA_PATH) when not given.
    type: path
  api_timeout:
    description:
      - Seconds to wait for one HTTP answer of the API (not for tasks, see the module's own timeouts).
    type: int
    default: 30
  write_concurrency:
    description:
      - At most this many API writes (clone, configure, start, stop, destroy, each with its task) run at once from
        this controller, counted across processes (the forks of one C(llmgw.fleet.add_node) run, or several runs),
        through lock files under C(~/.cache/llmgw/proxmox-writes/). V(0) sets no limit.
      - A write that Proxmox VE refuses because a config file lock could not be taken (C(can't lock file ... - got
        timeout), nothing done) is tried again after 1, 2, 4 and 8 seconds (with jitter) before it fails.
      - Set it in the inventory as C(fleet_proxmox.write_concurrency).
    type: int
    default: 4
requirements:
  - proxmoxer >= 2.0
  - requests
"""

    ACTIONGROUP_PROXMOX = r"""
options: {}
attributes:
  action_group:
    description: Use C(group/llmgw.fleet.proxmox) in C(module_defaults) to set the connection options once.
    support: full
    membership:
      - llmgw.fleet.proxmox
"""
