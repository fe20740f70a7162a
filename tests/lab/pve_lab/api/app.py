"""Everything one API server holds: state, tasks, faults, auth, and the node backend it drives."""

from __future__ import annotations

import logging
from typing import Optional

from pve_lab.api import credentials, template
from pve_lab.api.auth import TICKET_LIFETIME, Authenticator
from pve_lab.api.constants import NODE, LabPaths
from pve_lab.api.errors import config_missing
from pve_lab.api.faults import Faults
from pve_lab.api.permissions import Acl
from pve_lab.api.state import VM, ConfigLocks, LabState
from pve_lab.api.tasks import TaskRegistry

LOG = logging.getLogger("pve_lab.api")


class App:
    def __init__(self, paths: LabPaths, backend, backend_kind: str, unauthorized_delay: float = 0.1):
        self.paths = paths
        self.node = NODE
        self.creds = credentials.load_or_create(paths)
        self.state = LabState(paths.state_file)
        if self.state.fresh:
            template.seed(self.state)
        self.config_locks = ConfigLocks()
        self.faults = Faults()
        self.auth = Authenticator(self.creds, lambda: self.faults.ticket_lifetime or TICKET_LIFETIME)
        self.acl = Acl()
        self.tasks = TaskRegistry(NODE, paths.tasks_file, self.faults)
        self.backend = backend
        self.backend_kind = backend_kind
        self.unauthorized_delay = unauthorized_delay
        self.reconcile()

    def reconcile(self) -> None:
        """After a restart: a VM recorded as running whose guest is gone is stopped."""
        with self.state.lock:
            for vm in self.state.vms.values():
                self.is_running(vm)

    def vm(self, vmid: int) -> VM:
        vm = self.state.vms.get(vmid)
        if vm is None:
            raise config_missing(self.node, vmid)
        return vm

    def find(self, vmid: int) -> Optional[VM]:
        return self.state.vms.get(vmid)

    def is_running(self, vm: VM) -> bool:
        """Whether the VM's guest runs; the backend knows, unless it has no guests (then the record does)."""
        if not getattr(self.backend, "tracks_guests", True):
            return vm.status == "running"
        try:
            running = bool(self.backend.is_running(vm.vmid))
        except Exception as err:  # a backend that cannot tell is logged and treated as "not running"
            LOG.warning("is_running(%d) failed: %s", vm.vmid, err)
            running = False
        if not running and vm.status == "running":
            with self.state.lock:
                vm.status, vm.started_at = "stopped", None
                self.state.save()
        return running

    @property
    def spec_class(self):
        from pve_lab.nodes.spec import VMSpec

        return VMSpec
