"""The workers behind status/start, stop, shutdown, reboot and reset (qemu-server's vm_start / vm_stop).

Each runs inside a task, under the VM's config lock; the node backend call (which blocks until the guest is
launched or gone) happens outside the state lock.
"""

from __future__ import annotations

import time
from typing import Optional

from pve_lab.api import vm_config
from pve_lab.api.app import App
from pve_lab.api.constants import BRIDGE
from pve_lab.api.errors import TaskError
from pve_lab.api.qemu_schema import NET_FORMAT
from pve_lab.api.state import VM
from pve_lab.api.tasks import TaskContext


def _missing_on_node(app: App, vmid: int) -> TaskError:
    return TaskError("unable to find configuration file for VM %d on node '%s'" % (vmid, app.node))


def _check_lock(vm: VM, skiplock: bool) -> None:
    if vm.lock and not skiplock:
        raise TaskError("VM is locked (%s)" % vm.lock)


def _boot(app: App, vm: VM, ctx: TaskContext, apply_pending: bool = True) -> None:
    """Launch the guest from the (current) config; the caller holds the config lock, not the state lock."""
    with app.state.change():
        if apply_pending:
            vm.apply_pending()
        for key, value in sorted(vm.config.items()):
            if key.startswith("net") and key[3:].isdigit():
                bridge = NET_FORMAT.parse(value).get("bridge")
                if bridge and bridge != BRIDGE:
                    raise TaskError("bridge '%s' does not exist" % bridge)
        spec = vm_config.node_spec(vm, app.spec_class)
        if vm_config.has_cloudinit_drive(vm.config):
            vm.cloudinit_image = vm_config.cloudinit_values(vm.config)
    app.backend.start(spec)
    with app.state.change():
        vm.status, vm.started_at = "running", time.time()


def _halt(app: App, vm: VM, graceful: bool = False, timeout: Optional[int] = None) -> None:
    """Stop the guest: hard, or (shutdown) the way PVE asks a guest to go down, hard after the timeout."""
    shutdown = getattr(app.backend, "shutdown", None)
    if graceful and callable(shutdown):
        shutdown(vm.vmid, timeout=float(60 if timeout is None else timeout))
    else:
        app.backend.stop(vm.vmid)
    with app.state.change():
        vm.status, vm.started_at = "stopped", None


def start(app: App, vmid: int, ctx: TaskContext, skiplock: bool = False) -> None:
    with app.config_locks.hold(vmid):
        with app.state.change():
            vm = app.find(vmid)
            if vm is None:
                raise TaskError("Configuration file 'nodes/%s/qemu-server/%d.conf' does not exist" % (app.node, vmid))
            if vm.is_template:
                raise TaskError("you can't start a vm if it's a template")
            _check_lock(vm, skiplock)
            if app.is_running(vm):
                raise TaskError("VM %d already running" % vmid)
        _boot(app, vm, ctx)


def stop(app: App, vmid: int, ctx: TaskContext, skiplock: bool = False, graceful: bool = False,
         timeout: Optional[int] = None) -> None:
    """Stop (hard) or shutdown (graceful); a VM that is not running is no error."""
    with app.config_locks.hold(vmid):
        with app.state.change():
            vm = app.find(vmid)
            if vm is None:
                raise _missing_on_node(app, vmid)
            if not app.is_running(vm):
                return
            _check_lock(vm, skiplock)
        _halt(app, vm, graceful, timeout)


def reboot(app: App, vmid: int, ctx: TaskContext, apply_pending: bool = True) -> None:
    """Reboot applies pending changes (it is a shutdown and a fresh start); reset does not."""
    with app.config_locks.hold(vmid):
        with app.state.change():
            vm = app.find(vmid)
            if vm is None:
                raise _missing_on_node(app, vmid)
            _check_lock(vm, False)
            running = app.is_running(vm)
        if running:
            _halt(app, vm, graceful=apply_pending)
        _boot(app, vm, ctx, apply_pending=apply_pending)
