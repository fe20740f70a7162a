# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
name: fleet
short_description: The fleet registry's nodes as hosts, grouped by fabric and by state
version_added: 0.1.0
description:
  - Reads the nodes recorded in the fleet registry (M(llmgw.fleet.fleet_node)) and yields one host per node.
  - Groups are C(fabric_<fabric>) (the fabric name with anything but letters, digits and C(_) turned into
    C(_), so fabric C(ib-a) is group C(fabric_ib_a)), the node's state (C(pending), C(ready), C(draining),
    C(maintenance), C(lost)), and C(fleet) for every node.
  - Host variables are C(ansible_host) (the node's address) and C(fleet_*) for everything recorded about the
    node, including the GPUs it has free and the shards it holds.
  - The configuration file's name must end in C(fleet.yml) or C(fleet.yaml).
author:
  - llmgw.fleet developers (@llmgw)
extends_documentation_fragment:
  - ansible.builtin.constructed
options:
  plugin:
    description: The name of this plugin.
    required: true
    type: str
    choices: [llmgw.fleet.fleet]
  db:
    description:
      - Path of the registry database. Defaults to E(LLMGW_FLEET_DB), then C($XDG_DATA_HOME/llmgw/fleet.db),
        then C(~/.local/share/llmgw/fleet.db). A registry that does not exist yields no hosts and a warning.
    type: path
    env:
      - name: LLMGW_FLEET_DB
  states:
    description: Only nodes in these states (all when omitted).
    type: list
    elements: str
    choices: [pending, ready, draining, maintenance, lost]
"""

EXAMPLES = r"""
# inventories/lab.fleet.yml -- then target a fabric, a state, or both: --limit 'fabric_ib_a:&ready'
plugin: llmgw.fleet.fleet
# The registry to read (default: $LLMGW_FLEET_DB, else ~/.local/share/llmgw/fleet.db).
db: /srv/llmgw/fleet.db
# Only nodes that run work or are finishing it.
states: [ready, draining]
# More groups from the recorded facts, as with any constructed inventory: cpu_haswell, ...
keyed_groups:
  - key: fleet_cpu_variant
    prefix: cpu
    default_value: unknown
compose:
  ansible_user: "'llmgw'"
"""

RETURN = r"""
# Host variables set on every node (the inventory plugin returns hosts, not a value).
ansible_host:
  description: The node's recorded address.
  returned: when an address is recorded
  type: str
fleet_fabric:
  description: The fabric the node is on; the node is also in group C(fabric_<fabric>).
  returned: always
  type: str
fleet_state:
  description: C(pending), C(ready), C(draining), C(maintenance) or C(lost); the node is also in the group of that name.
  returned: always
  type: str
fleet_gpus:
  description: GPUs on the node.
  returned: always
  type: int
fleet_free_gpus:
  description: GPUs no shard holds.
  returned: always
  type: int
fleet_shards:
  description:
    - Shards on the node, each with C(replica), C(rank), C(gpus), C(state), C(leader), C(leader_address),
      C(shard_count), C(engine), C(model), C(port) and C(replica_state).
  returned: always
  type: list
  elements: dict
fleet_reasons:
  description: Why the node is in its state.
  returned: always
  type: list
  elements: str
fleet_address:
  description: The node's recorded address, as recorded (also when it is empty).
  returned: always
  type: str
fleet_vmid:
  description: Proxmox VM id.
  returned: always
  type: int
fleet_proxmox_node:
  description: Proxmox VE node the VM runs on.
  returned: always
  type: str
fleet_gpu_type:
  description: GPU model.
  returned: always
  type: str
fleet_cpu_variant:
  description: ggml CPU backend variant of the node.
  returned: always
  type: str
fleet_engine_version:
  description: Inference engine version on the node.
  returned: always
  type: str
fleet_engine_args:
  description: Arguments every llama-server on the node gets, as onboarding found them (for example C(--no-repack)).
  returned: always
  type: list
  elements: str
fleet_speed:
  description: The node's speed as onboarding measured it against its own scalar baseline - C(variant), C(threads),
    C(vcpus), C(pp) and C(tg) (tokens per second of prompt processing and generation), C(baseline_pp) and
    C(baseline_tg) (with C(x64) forced), C(pp_ratio) and C(tg_ratio); C({}) when not measured. For example
    C(keyed_groups) on C(fleet_speed.variant), or C(groups) such as C(fast - fleet_speed.pp_ratio | default(0) > 10).
  returned: always
  type: dict
fleet_cert_fingerprint:
  description: SHA-256 fingerprint of the node's certificate.
  returned: always
  type: str
fleet_last_seen:
  description: When the node was last seen (UTC, ISO 8601).
  returned: always
  type: str
"""

import os
import re

from ansible.errors import AnsibleParserError
from ansible.plugins.inventory import BaseInventoryPlugin, Constructable
from ansible.utils.display import Display

from ansible_collections.llmgw.fleet.plugins.module_utils import fleet_registry

display = Display()

HOST_VARS = ("vmid", "proxmox_node", "fabric", "gpu_type", "free_gpus", "cpu_variant", "engine_version",
             "engine_args", "speed", "cert_fingerprint", "state", "reasons", "last_seen", "address")


def group_name(prefix: str, value: str) -> str:
    return prefix + re.sub(r"[^A-Za-z0-9_]", "_", value)


class InventoryModule(BaseInventoryPlugin, Constructable):
    NAME = "llmgw.fleet.fleet"

    def verify_file(self, path):
        return super().verify_file(path) and path.endswith(("fleet.yml", "fleet.yaml"))

    def parse(self, inventory, loader, path, cache=True):
        super().parse(inventory, loader, path, cache)
        self._read_config_data(path)
        db = fleet_registry.resolve_path(self.get_option("db"))
        if not os.path.exists(db):
            display.warning("llmgw.fleet.fleet: no fleet registry at %s; no hosts" % db)
            return
        try:
            with fleet_registry.FleetRegistry(db, create=False) as registry, registry.snapshot_read():
                nodes = registry.list_nodes()
                replicas = {r["name"]: r for r in registry.list_replicas()}
        except fleet_registry.RegistryError as exc:
            raise AnsibleParserError("llmgw.fleet.fleet: %s" % exc)
        states = self.get_option("states")
        strict = self.get_option("strict")
        self.inventory.add_group("fleet")
        for node in nodes:
            if states and node["state"] not in states:
                continue
            host = self.inventory.add_host(node["name"], group="fleet")
            for group in (group_name("fabric_", node["fabric"]), node["state"]):
                self.inventory.add_group(group)
                self.inventory.add_child(group, host)
            hostvars = {"fleet_" + key: node[key] for key in HOST_VARS}
            hostvars["fleet_gpus"] = node["gpu_count"]
            hostvars["fleet_shards"] = [_shard_vars(replicas[s["replica"]], s["rank"]) for s in node["shards"]]
            if node["address"]:
                hostvars["ansible_host"] = node["address"]
            for key, value in hostvars.items():
                self.inventory.set_variable(host, key, value)
            self._set_composite_vars(self.get_option("compose"), hostvars, host, strict=strict)
            self._add_host_to_composed_groups(self.get_option("groups"), hostvars, host, strict=strict)
            self._add_host_to_keyed_groups(self.get_option("keyed_groups"), hostvars, host, strict=strict)


def _shard_vars(replica, rank):
    shard = next(s for s in replica["shards"] if s["rank"] == rank)
    return {"replica": replica["name"], "rank": rank, "gpus": shard["gpus"], "leader": replica["leader"],
            "leader_address": replica["shards"][0]["address"] if replica["shards"] else None,
            "shard_count": replica["shard_count"], "engine": replica["engine"], "model": replica["model"],
            "port": replica["port"], "replica_state": replica["state"], "state": shard["state"]}
