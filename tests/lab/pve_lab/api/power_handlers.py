"""{vmid}/status/*: current, start, stop, shutdown, reboot, reset (qemu-server's vm_status, vm_start, ...)."""

from __future__ import annotations

from typing import Dict

from pve_lab.api import power, vm_views
from pve_lab.api.app import App
from pve_lab.api.errors import fail
from pve_lab.api.router import Request, root_only, route
from pve_lab.api.schema import Prop, node_format
from pve_lab.api.tasks import TaskContext

BOOL = Prop(type="boolean")
TIMEOUT = Prop(type="integer", minimum=0)


def status_index(app: App, p: Dict[str, object], req: Request) -> object:
    app.vm(p["vmid"])
    return [{"subdir": s} for s in ("current", "start", "stop", "reset", "shutdown", "suspend", "reboot")]


def status_current(app: App, p: Dict[str, object], req: Request) -> object:
    with app.state.lock:
        return vm_views.current(app, app.vm(p["vmid"]))


def _require_running(app: App, vmid: int) -> None:
    """check_running before forking: the VM must exist on this node, and run."""
    with app.state.lock:
        vm = app.find(vmid)
        if vm is None:
            raise fail("unable to find configuration file for VM %d on node '%s'" % (vmid, app.node))
        if not app.is_running(vm):
            raise fail("VM %d not running" % vmid)


def start(app: App, p: Dict[str, object], req: Request) -> object:
    vmid = p["vmid"]
    root_only(req, p, ["stateuri", "skiplock", "migratedfrom", "migration_type", "migration_network",
                       "targetstorage", "force-cpu", "with-conntrack-state", "nets-host-mtu"])
    return app.tasks.spawn("qmstart", str(vmid), req.user,
                           lambda ctx: power.start(app, vmid, ctx, bool(p.get("skiplock"))), vmid=vmid)


def stop(app: App, p: Dict[str, object], req: Request) -> object:
    vmid = p["vmid"]
    root_only(req, p, ["skiplock", "keepActive", "migratedfrom"])
    return app.tasks.spawn("qmstop", str(vmid), req.user,
                           lambda ctx: power.stop(app, vmid, ctx, bool(p.get("skiplock"))), vmid=vmid)


def shutdown(app: App, p: Dict[str, object], req: Request) -> object:
    vmid = p["vmid"]
    root_only(req, p, ["skiplock", "keepActive"])
    return app.tasks.spawn("qmshutdown", str(vmid), req.user,
                           lambda ctx: power.stop(app, vmid, ctx, bool(p.get("skiplock")), graceful=True,
                                                  timeout=p.get("timeout")), vmid=vmid)


def reboot(app: App, p: Dict[str, object], req: Request) -> object:
    vmid = p["vmid"]
    _require_running(app, vmid)

    def work(ctx: TaskContext) -> None:
        power.reboot(app, vmid, ctx)

    return app.tasks.spawn("qmreboot", str(vmid), req.user, work, vmid=vmid)


def reset(app: App, p: Dict[str, object], req: Request) -> object:
    vmid = p["vmid"]
    root_only(req, p, ["skiplock"])
    _require_running(app, vmid)
    return app.tasks.spawn("qmreset", str(vmid), req.user,
                           lambda ctx: power.reboot(app, vmid, ctx, apply_pending=False), vmid=vmid)


ROUTES = [
    route("GET", "/nodes/{node}/qemu/{vmid}/status", status_index),
    route("GET", "/nodes/{node}/qemu/{vmid}/status/current", status_current),
    route("POST", "/nodes/{node}/qemu/{vmid}/status/start", start, {
        "skiplock": BOOL, "stateuri": Prop(max_length=128), "migratedfrom": Prop(format=node_format),
        "migration_type": Prop(enum=["secure", "insecure"]), "migration_network": Prop(), "machine": Prop(),
        "force-cpu": Prop(), "targetstorage": Prop(), "timeout": TIMEOUT, "with-conntrack-state": BOOL,
        "nets-host-mtu": Prop()}),
    route("POST", "/nodes/{node}/qemu/{vmid}/status/stop", stop, {
        "skiplock": BOOL, "migratedfrom": Prop(format=node_format), "timeout": TIMEOUT, "keepActive": BOOL,
        "overrule-shutdown": BOOL}),
    route("POST", "/nodes/{node}/qemu/{vmid}/status/shutdown", shutdown, {
        "skiplock": BOOL, "timeout": TIMEOUT, "forceStop": BOOL, "keepActive": BOOL}),
    route("POST", "/nodes/{node}/qemu/{vmid}/status/reboot", reboot, {"timeout": TIMEOUT}),
    route("POST", "/nodes/{node}/qemu/{vmid}/status/reset", reset, {"skiplock": BOOL}),
]
