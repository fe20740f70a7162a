# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The checks of ``llmgw.fleet.pve_vm`` before its first write: which VM the request names (and the VMID it asks
for), the template to clone from, the node a new VM goes to, a VMID or address another guest holds, a slow CPU, a
VM that stays locked, and a privilege the API token lacks. Each refusal is a :class:`VMRefused` (a slow CPU:
vm_plan's :class:`PlanError`) decided from reads only, so a refused run changes nothing.

Private to :mod:`pve_vm_runner` (which re-exports :class:`VMRefused`): :class:`VMChecks` is a part of
:class:`pve_vm_runner.VMRunner`. It does I/O: reads through the Proxmox client (``vm_config``, ``nodes``,
``wait_unlocked``, ``privileges``), never a write.
"""

from __future__ import annotations

from ansible_collections.llmgw.fleet.plugins.module_utils._vm_privileges import missing, refusal
from ansible_collections.llmgw.fleet.plugins.module_utils.proxmox_client import match_vms
from ansible_collections.llmgw.fleet.plugins.module_utils.proxmox_errors import Locked, NotFound, ProxmoxError
from ansible_collections.llmgw.fleet.plugins.module_utils.vm_plan import (
    address_of,
    check_cpu,
    derive_vmid,
    parse_address,
    same_host_ip,
)

# What to do about a lock that outlasted the wait, by its reason (qemu-server's `lock` values). Only a 'clone' or
# 'create' lock that never clears means a VM half-made; the others belong to work the VM is still doing.
LOCK_ADVICE = {
    "backup": "A backup (vzdump) of it is running: let it finish, then run again; never 'qm unlock' a VM whose "
              "backup runs (see the node's task log for the vzdump task; a backup that died leaves the lock: only "
              "then, qm unlock %(vmid)s)",
    "migrate": "It is being migrated: let the migration finish, then run again (after a failed migration, check "
               "where its disks are before 'qm unlock %(vmid)s')",
    "snapshot": "A snapshot of it is being taken: let the task finish, then run again",
    "snapshot-delete": "A snapshot of it is being removed: let the task finish, then run again",
    "rollback": "It is being rolled back to a snapshot: let the task finish, then run again",
    "suspending": "It is being hibernated: let the task finish; then 'qm resume %(vmid)s' (or start it) and run "
                  "again",
    "suspended": "It is hibernated: 'qm resume %(vmid)s' (or start it from the GUI), then run again",
}
HALF_MADE_ADVICE = (
    "A 'clone' or 'create' lock that never clears is a VM half-made by an interrupted run: check the node's task "
    "log; if no task is running for it, remove it (qm unlock %(vmid)s && qm destroy %(vmid)s --purge) and run again"
)


class VMRefused(Exception):
    """The run stopped before changing anything, because going on could lose something. (Not the solver's
    :class:`placement.Refusal`, which is an answer, not an error.)"""


def _describe(guest):
    return "%s %s (VMID %s on node %s%s)" % (
        "container" if guest.get("type") == "lxc" else ("template" if guest.get("template") else "VM"),
        repr(guest.get("name") or "") if guest.get("name") else "without a name",
        guest.get("vmid"),
        guest.get("node"),
        ", locked: %s" % guest["lock"] if guest.get("lock") else "",
    )


class VMChecks:
    """The checks and the reads they need: each refuses, or returns what it read (``_check_cpu`` adds a warning
    instead). The client (``client``), the request (``req``) and ``warnings`` come from
    :class:`pve_vm_runner.VMRunner`."""

    def _find(self, guests):
        """The VM named ``name`` (or None) and the VMID the request asks for (or None); refusals."""
        req = self.req
        named = match_vms(guests, name=req.name)
        if len(named) > 1:
            raise VMRefused(
                "name %r matches %d VMs: %s. Nothing was changed. Names must be unique in the fleet: rename or "
                "remove all but one (and pass vmid to say which one this task manages)."
                % (req.name, len(named), "; ".join(_describe(g) for g in sorted(named, key=lambda g: g["vmid"])))
            )
        vm = named[0] if named else None
        wanted_vmid = derive_vmid(req.address, req.vmid_base, req.vmid) if req.manages_identity else None
        if vm is not None and vm.get("template"):
            raise VMRefused(
                "name %r belongs to a template, %s; a fleet node cannot share its name. Nothing was changed."
                % (req.name, _describe(vm))
            )
        if vm is not None and wanted_vmid is not None and vm["vmid"] != wanted_vmid:
            how = (
                "vmid %d" % wanted_vmid
                if req.vmid is not None
                else ("VMID %d, derived from address %s (vmid_base %s)" % (wanted_vmid, req.address, req.vmid_base))
            )
            raise VMRefused(
                "name %r exists as %s, but this task asks for %s. Nothing was changed. If that VM is this node, "
                "pass vmid: %d (or the address it was built with); if the node is being rebuilt at a new "
                "address, remove the old VM first (state: absent)." % (req.name, _describe(vm), how, vm["vmid"])
            )
        return vm, wanted_vmid

    def _refuse_taken_vmid(self, guests, vmid):
        holders = [g for g in guests if g["vmid"] == vmid]
        if holders:
            raise VMRefused(
                "VMID %d (for %r) is already used by %s. Nothing was changed. Both names: %r wanted, %r found. "
                "Choose another address or vmid_base, pass an explicit vmid, or rename/remove the other guest if "
                "it is a leftover."
                % (vmid, self.req.name, _describe(holders[0]), self.req.name, holders[0].get("name") or "")
            )

    def _refuse_address_clash(self, guests, own_vmid):
        """An address is one node's: refuse when another VM's ipconfig0 already has it (containers ignored)."""
        if self.req.address is None:
            return
        owners = []
        for guest in guests:
            if guest.get("type") != "qemu" or guest.get("template") or guest["vmid"] == own_vmid:
                continue
            try:
                config = self.client.vm_config(guest["node"], guest["vmid"])
            except NotFound:
                continue  # removed while we looked
            if same_host_ip(address_of(config), self.req.address):
                owners.append(guest)
        if owners:
            raise VMRefused(
                "address %s is already used by %s (its ipconfig0). Nothing was changed. Give %r another address, "
                "or remove the other VM if it is a leftover."
                % (parse_address(self.req.address).ip, "; ".join(_describe(g) for g in owners), self.req.name)
            )

    def _refuse_unknown_vmid(self, vmid):
        if vmid is None:
            raise VMRefused(
                "VM %r does not exist and neither address nor vmid is given, so its VMID is unknown. Nothing "
                "was changed." % self.req.name
            )

    def _check_cpu(self):
        if self.req.cpu is None:
            return
        warning = check_cpu(self.req.cpu, self.req.allow_slow_cpu)
        if warning:
            self.warnings.append(warning)

    def _template(self, guests):
        clone = str(self.req.clone)
        if clone.isdigit():
            matches = [g for g in guests if g.get("type") == "qemu" and g["vmid"] == int(clone)]
        else:
            matches = [g for g in guests if g.get("type") == "qemu" and g.get("name") == clone]
        if not matches:
            raise VMRefused("template %r to clone from does not exist. Nothing was changed." % clone)
        if len(matches) > 1:
            raise VMRefused(
                "template name %r matches %d VMs: %s; pass its VMID as clone. Nothing was changed."
                % (clone, len(matches), "; ".join(_describe(g) for g in matches))
            )
        if not matches[0].get("template"):
            raise VMRefused(
                "%s is not a template; fleet nodes are cloned from a template (convert it first). Nothing was "
                "changed." % _describe(matches[0])
            )
        return matches[0]

    def _target_node(self, template):
        if template is not None and not self.req.node:
            return template["node"]
        nodes = self.client.nodes()
        if self.req.node:
            if self.req.node not in nodes:
                raise VMRefused(
                    "node=%r is not a node of the cluster (%s): give one of those, or leave node out to use the "
                    "template's. Nothing was changed." % (self.req.node, ", ".join(nodes) or "none listed")
                )
            return self.req.node
        if len(nodes) == 1:
            return nodes[0]
        raise VMRefused(
            "the cluster has %d nodes (%s); pass node (or PROXMOX_NODE) to say where %r goes. Nothing was "
            "changed." % (len(nodes), ", ".join(nodes), self.req.name)
        )

    def _require(self, needs, new_vmid=None):
        """Refuse before the first write when the token lacks a privilege the change needs: PVE would refuse
        the call itself, but only once the run got there (after the clone, say). A server that does not say what
        the token holds is left to check each call itself, with a warning. A VM this run makes (``new_vmid``) in a
        pool may use what the token holds on the pool (read for the pool's own need, ``pool_needs``)."""
        pool = self.req.pool if new_vmid is not None else None
        held = {}
        for path in sorted(set(need.path for need in needs)):
            try:
                held[path] = self.client.privileges(path)
            except ProxmoxError as exc:
                self.warnings.append(
                    "%s: the privileges of the API token could not be read (%s); Proxmox checks each call instead"
                    % (self.req.name, exc)
                )
                return
        lacking = missing(needs, held, pool=pool, vmid=new_vmid)
        if lacking:
            raise VMRefused(refusal(self.req.name, lacking))

    def _unlocked_config(self, vm):
        config = self.client.vm_config(vm["node"], vm["vmid"])
        if not config.get("lock"):
            return config
        try:
            return self.client.wait_unlocked(vm["node"], vm["vmid"], self.req.timeout)
        except Locked as exc:
            advice = LOCK_ADVICE.get(exc.reason, HALF_MADE_ADVICE) % {"vmid": vm["vmid"]}
            raise VMRefused(
                "VM %r (VMID %s on node %s) is still locked (%s) after %ss: %s. Nothing was changed. %s."
                % (self.req.name, vm["vmid"], vm["node"], exc.reason, self.req.timeout, exc, advice)
            )
