# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What ``llmgw.fleet.pve_vm`` does, between the module (parameters, messages) and the client (HTTP).

Every refusal is decided from reads only, before the first write, so a refused run changes nothing (the checks
are in :mod:`_vm_runner_checks`, private to this module, which re-exports :class:`VMRefused`). Every difference
found or made goes through one DifferenceTracker, which decides ``changed`` and the diff; in check mode the same
path runs with the writes left out.
"""

from __future__ import annotations

from ansible_collections.llmgw.fleet.plugins.module_utils import vm_fields
from ansible_collections.llmgw.fleet.plugins.module_utils._vm_info import describe_vm, vm_info
from ansible_collections.llmgw.fleet.plugins.module_utils._vm_privileges import (
    clone_needs,
    config_needs,
    create_needs,
    destroy_needs,
    pool_needs,
    power_needs,
)
from ansible_collections.llmgw.fleet.plugins.module_utils._vm_runner_checks import VMChecks, VMRefused
from ansible_collections.llmgw.fleet.plugins.module_utils.vm_plan import (
    DesiredVM,
    DifferenceTracker,
    PlanError,
    address_of,
    cpu_model,
    ipconfig0_for,
    next_id_clash,
    plan_config,
    reboot_warning,
)

__all__ = ["STATES", "Outcome", "VMRefused", "VMRequest", "VMRunner", "describe_vm", "run_vm", "vm_info"]

STATES = vm_fields.BY_NAME["state"].choices


class VMRequest:
    """The module's parameters, as the runner needs them: one attribute per pve_vm option (vm_fields.OPTIONS),
    with the defaults the module documents."""

    def __post_init__(self):
        if self.state not in STATES:
            raise PlanError("state %r is not one of %s" % (self.state, ", ".join(STATES)))
        refused = vm_fields.option_problems(self)
        if refused:
            raise PlanError("%s: refused before any change: %s" % (self.name, "; ".join(refused)))

    @property
    def manages_identity(self):
        return self.address is not None or self.vmid is not None


VMRequest = vm_fields.record_class(VMRequest, vm_fields.OPTIONS)


class Outcome:
    def __init__(self, tracker, result, warnings):
        self.tracker = tracker
        self.result = result
        self.warnings = warnings

    @property
    def changed(self):
        return not self.tracker.empty

    @property
    def diff(self):
        before, after = self.tracker.before_after()
        return {"before": before, "after": after}


class VMRunner(VMChecks):
    """One run of pve_vm; its checks before the first write are in :class:`VMChecks`."""

    def __init__(self, client, request, check_mode=False):
        self.client = client
        self.req = request
        self.check_mode = check_mode
        self.tracker = DifferenceTracker()
        self.warnings = []

    # ---------------------------------------------------------------------------------------------- pieces

    def _desired(self, vmid):
        req = self.req
        # Every desired field the request carries as it is; vmid (resolved) and ipconfig0 (derived) apart.
        values = dict((f.name, getattr(req, f.name)) for f in vm_fields.DESIRED if f.option)
        values.update(vmid=vmid, ipconfig0=ipconfig0_for(req.address, req.gateway) if req.address else None)
        return DesiredVM(**values)

    def _result(self, vmid, node, status, config):
        return {
            "vmid": vmid,
            "node": node,
            "name": self.req.name,
            "cpu": cpu_model(config.get("cpu")) if config is not None else None,
            "address": address_of(config) if config is not None else None,
            "status": status,
        }

    # ----------------------------------------------------------------------------------------------- run

    def run(self):
        guests = self.client.guests()
        vm, wanted_vmid = self._find(guests)
        if self.req.state == "absent":
            return self._absent(vm)
        self._check_cpu()
        if vm is None:
            self._refuse_unknown_vmid(wanted_vmid)
            self._refuse_taken_vmid(guests, wanted_vmid)
        self._refuse_address_clash(guests, vm["vmid"] if vm else wanted_vmid)
        if vm is None:
            return self._create(guests, wanted_vmid)
        return self._converge(vm)

    def _outcome(self, result):
        return Outcome(self.tracker, result, self.warnings)

    def _absent(self, vm):
        if vm is None:
            return self._outcome(
                {"vmid": None, "node": None, "name": self.req.name, "cpu": None, "address": None, "status": "absent"}
            )
        config = self._unlocked_config(vm)
        status = self.client.vm_status(vm["node"], vm["vmid"]).get("status")
        self._require(destroy_needs(vm["vmid"], status == "running"))
        self.tracker.add("state", "present", "absent")
        if not self.check_mode:
            if status == "running":
                self.client.stop_vm(vm["node"], vm["vmid"], self.req.timeout)
            self.client.delete_vm(vm["node"], vm["vmid"], self.req.timeout)
        result = self._result(vm["vmid"], vm["node"], "absent", config)
        return self._outcome(result)

    def _create(self, guests, vmid):
        req = self.req
        template = self._template(guests) if req.clone is not None else None
        node = self._target_node(template)
        clash = next_id_clash(vmid, self.client.next_free_id(), None if req.vmid is not None else req.vmid_base)
        if clash:
            self.warnings.append(clash)
        desired = self._desired(vmid)
        template_config = dict(self.client.vm_config(template["node"], template["vmid"])) if template else {}
        base = dict(template_config)
        base.pop("template", None)
        base["name"] = req.name
        plan = plan_config(desired, base, running=False)
        if template:
            needs = clone_needs(template["vmid"], template_config, vmid, req.storage) + config_needs(vmid, plan.params)
        else:
            needs = create_needs(vmid, self._create_params(plan))
        needs += pool_needs(vmid, req.pool) + (power_needs(vmid, "starting it") if req.state == "started" else [])
        self._require(needs, new_vmid=vmid)

        self.tracker.add("state", "absent", "present")
        for change in plan.changes:
            self.tracker.add(change.key, change.before, change.after)
        final_status = "running" if req.state == "started" else "stopped"
        if req.state == "started":
            self.tracker.add("status", "absent", "running")
        if self.check_mode:
            predicted = dict(base)
            predicted.update(plan.params)
            return self._outcome(self._fresh_result(vmid, node, final_status, predicted))

        if template:
            self.client.clone_vm(
                template["node"],
                template["vmid"],
                vmid,
                req.name,
                req.timeout,
                full=req.full_clone,
                target=node if node != template["node"] else None,
                storage=req.storage,
                pool=req.pool,
            )
            config = self.client.wait_unlocked(node, vmid, req.timeout)
            # Plan again on what the clone really produced: the template may have changed since it was read.
            plan = plan_config(desired, config, running=False)
            if not plan.empty:
                self.client.update_config(node, vmid, plan.params, req.timeout, digest=plan.digest)
        else:
            self.client.create_vm(node, vmid, self._create_params(plan), req.timeout)
        if req.state == "started":
            self.client.start_vm(node, vmid, req.timeout)
        config = self.client.vm_config(node, vmid)
        status = self.client.vm_status(node, vmid).get("status", final_status)
        return self._outcome(self._fresh_result(vmid, node, status, config))

    def _create_params(self, plan):
        """The parameters of a VM created without a template."""
        params = dict(plan.params)
        params["name"] = self.req.name
        if self.req.bridge:
            params["net0"] = "virtio,bridge=%s" % self.req.bridge
        if self.req.pool:
            params["pool"] = self.req.pool
        return params

    def _fresh_result(self, vmid, node, status, config):
        """A VM made by this run has nothing waiting for a boot: it was configured before its first start."""
        result = self._result(vmid, node, status, config)
        result.update(reboot_required=False, pending=[])
        return result

    def _converge(self, vm):
        req = self.req
        node, vmid = vm["node"], vm["vmid"]
        config = self._unlocked_config(vm)
        status = self.client.vm_status(node, vmid).get("status")
        running = status == "running"
        plan = plan_config(self._desired(vmid), config, running=running)
        for change in plan.changes:
            self.tracker.add(change.key, change.before, change.after)
        # Changes left waiting for a boot by an earlier run (or by hand) count too; a boot clears them.
        waiting = sorted(set(plan.reboot_keys) | set(self.client.pending_keys(node, vmid) if running else []))
        needs = config_needs(vmid, plan.params)
        if req.state == "started" and not running:
            needs += power_needs(vmid, "starting it")
        elif req.state == "stopped" and running:
            needs += power_needs(vmid, "shutting it down")
        elif running and waiting and req.reboot_if_needed:
            needs += power_needs(vmid, "rebooting it")
        self._require(needs)

        if not self.check_mode and not plan.empty:
            self.client.update_config(node, vmid, plan.params, req.timeout, digest=plan.digest)
            config = None

        final_status = status
        if req.state == "started" and not running:
            self.tracker.add("status", status, "running")
            final_status = "running"
            if not self.check_mode:
                self.client.start_vm(node, vmid, req.timeout)
        elif req.state == "stopped" and running:
            self.tracker.add("status", status, "stopped")
            final_status = "stopped"
            if not self.check_mode:
                self.client.shutdown_vm(node, vmid, req.timeout, req.shutdown_timeout)
        elif running and waiting:
            if req.reboot_if_needed:
                self.tracker.add("reboot", {"pending": waiting}, "rebooted")
                if not self.check_mode:
                    self.client.reboot_vm(node, vmid, req.timeout)
            else:
                self.warnings.append(reboot_warning(req.name, vmid, waiting))
        reboot_required = bool(running and waiting and final_status == "running" and not req.reboot_if_needed)

        if config is None:
            config = self.client.vm_config(node, vmid)
        elif self.check_mode and not plan.empty:
            config = dict(config)
            config.update(plan.params)
        if not self.check_mode:
            final_status = self.client.vm_status(node, vmid).get("status", final_status)
        result = self._result(vmid, node, final_status, config)
        result["reboot_required"] = reboot_required
        result["pending"] = waiting if reboot_required else []
        return self._outcome(result)


def run_vm(client, request, check_mode=False):
    return VMRunner(client, request, check_mode=check_mode).run()
