"""GET/PUT/POST {vmid}/config and GET {vmid}/pending (qemu-server's vm_config, update_vm_api, vm_pending).

A `digest` that no longer matches the config is refused ("checksum mismatch"), as is any change to a locked VM.
PUT applies at once and answers null; POST does the same as a `qmconfig` task and answers its UPID (a `delete` of
an option that is not set is a warning there, so the task ends `WARNINGS: 1`).
"""

from __future__ import annotations

import time
from typing import Callable, Dict, List

from pve_lab.api import config_checks, vm_config, vm_views
from pve_lab.api.app import App
from pve_lab.api.errors import ApiError, fail, param_error
from pve_lab.api.qemu_schema import COLD_OPTIONS, CONFIG_PROPS
from pve_lab.api.router import Request, root_only, root_only_config, route
from pve_lab.api.schema import Prop, configid_list_format, split_list
from pve_lab.api.state import VM
from pve_lab.api.tasks import TaskContext

BOOL = Prop(type="boolean")


def get_config(app: App, p: Dict[str, object], req: Request) -> object:
    if p.get("snapshot") and p.get("current"):
        message = "cannot use 'snapshot' parameter with 'current'"
        raise param_error({"snapshot": message, "current": message})
    with app.state.lock:
        vm = app.vm(p["vmid"])
        if p.get("snapshot"):
            raise fail("snapshot '%s' does not exist" % p["snapshot"])
        data = vm_views.typed_config(vm.config if p.get("current") else vm.effective())
        data["digest"] = vm.digest()
        return data


def get_pending(app: App, p: Dict[str, object], req: Request) -> object:
    with app.state.lock:
        vm = app.vm(p["vmid"])
        items: List[Dict[str, object]] = []
        current = vm_views.typed_config(vm.config)
        current["digest"] = vm.digest()
        pending = vm_views.typed_config(vm.pending)
        for key in sorted(set(current) | set(pending)):
            item: Dict[str, object] = {"key": key}
            if key in current:
                item["value"] = current[key]
            if key in pending:
                item["pending"] = pending[key]
            if key in vm.pending_delete:
                item["delete"] = 1
            items.append(item)
        return items


def cloudinit_pending(app: App, p: Dict[str, object], req: Request) -> object:
    """GET {vmid}/cloudinit: each cloud-init option with the value the drive holds and the one it will get."""
    with app.state.lock:
        vm = app.vm(p["vmid"])
        now = vm_config.cloudinit_values(vm.config)
        image = vm.cloudinit_image if vm.cloudinit_image is not None else now
    mask = {"cipassword": "**********"}
    items: List[Dict[str, object]] = []
    for key in sorted(set(now) | set(image)):
        if key not in now:
            items.append({"key": key, "delete": 1})
        elif key not in image:
            items.append({"key": key, "pending": mask.get(key, now[key])})
        elif image[key] != now[key]:
            items.append({"key": key, "value": mask.get(key, image[key]), "pending": mask.get(key, now[key])})
        else:
            items.append({"key": key, "value": mask.get(key, now[key])})
    return items


def cloudinit_update(app: App, p: Dict[str, object], req: Request) -> object:
    """PUT {vmid}/cloudinit: regenerate the cloud-init drive from the current config."""
    vmid = p["vmid"]
    with app.config_locks.hold(vmid), app.state.change():
        vm = app.vm(vmid)
        if vm.lock:
            raise fail("VM is locked (%s)" % vm.lock)
        if vm_config.has_cloudinit_drive(vm.config):
            vm.cloudinit_image = vm_config.cloudinit_values(vm.config)
    return None


def _deletes(p: Dict[str, object], params: Dict[str, str], reverts: List[str]) -> List[str]:
    deletes = []
    for opt in split_list(str(p.get("delete") or "")):
        opt = "ide2" if opt == "cdrom" else opt
        if opt in params:
            raise param_error({"delete": "you can't use '-%s' and -delete %s' at the same time" % (opt, opt)})
        if opt in reverts:
            raise param_error({"revert": "you can't use '-delete %s' and -revert %s' at the same time" % (opt, opt)})
        if opt not in CONFIG_PROPS:
            raise param_error({"delete": "unknown option '%s'" % opt})
        deletes.append(opt)
    return deletes


def _reverts(p: Dict[str, object], params: Dict[str, str]) -> List[str]:
    reverts = []
    for opt in split_list(str(p.get("revert") or "")):
        if opt not in CONFIG_PROPS:
            raise param_error({"revert": "unknown option '%s'" % opt})
        if opt in params:
            raise param_error({"delete": "you can't use '-%s' and -revert %s' at the same time" % (opt, opt)})
        reverts.append(opt)
    return reverts


def _load_and_check(app: App, vmid: int, p: Dict[str, object], params: Dict[str, str]) -> VM:
    vm = app.vm(vmid)
    digest = p.get("digest")
    if digest and digest != vm.digest():
        raise fail("checksum mismatch (file change by other user?)")
    if vm.lock and not p.get("skiplock"):
        raise fail("VM is locked (%s)" % vm.lock)
    if "memory" in params or "balloon" in params:
        balloon = int(params.get("balloon", vm.pending.get("balloon", vm.config.get("balloon", "0"))))
        if balloon and balloon > vm_config.memory_mib({**vm.effective(), **params}):
            raise fail("balloon value too large (must be smaller than assigned memory)")
    return vm


def _updater(app: App, p: Dict[str, object], req: Request) -> Callable[[Callable[[str], None]], None]:
    """update_vm_api up to the worker: checks everything it can before locking, returns the worker."""
    vmid = p["vmid"]
    root_only(req, p, ["skiplock"])
    params = config_checks.config_params(p)
    root_only_config(req, params)
    reverts = _reverts(p, params)
    deletes = _deletes(p, params, reverts)
    if not params and not deletes and not reverts:
        raise fail("no options specified")
    with app.state.lock:
        params = config_checks.prepare(app.state, params)
        _load_and_check(app, vmid, p, params)

    def apply(warn: Callable[[str], None]) -> None:
        with app.config_locks.hold(vmid), app.state.change():
            vm = _load_and_check(app, vmid, p, params)
            for opt in reverts:
                vm.pending.pop(opt, None)
                if opt in vm.pending_delete:
                    vm.pending_delete.remove(opt)
            vm_config.update(app.state, vm, params, deletes, app.is_running(vm), COLD_OPTIONS, warn)

    return apply


def put_config(app: App, p: Dict[str, object], req: Request) -> object:
    _updater(app, p, req)(lambda message: None)
    return None


def post_config(app: App, p: Dict[str, object], req: Request) -> object:
    apply = _updater(app, p, req)

    def work(ctx: TaskContext) -> None:
        ctx.log("update VM %d: %s" % (p["vmid"], " ".join("-%s %s" % (k, v) for k, v in sorted(p.items())
                                                          if k not in ("node", "vmid", "digest"))))
        try:
            apply(ctx.warn)
        except ApiError as err:
            raise RuntimeError(err.message)

    upid = app.tasks.spawn("qmconfig", str(p["vmid"]), req.user, work, vmid=p["vmid"])
    delay = p.get("background_delay")
    if delay:
        deadline = time.monotonic() + float(delay)
        while time.monotonic() < deadline:
            task = app.tasks.get(upid)
            if task.status == "stopped":
                if task.exitstatus == "OK" or str(task.exitstatus).startswith("WARNINGS"):
                    return None
                raise fail("failed to update VM %d: %s" % (p["vmid"], task.exitstatus))
            time.sleep(0.1)
    return upid


UPDATE_PROPS = {
    **CONFIG_PROPS,
    "skiplock": BOOL,
    "delete": Prop(format=configid_list_format),
    "revert": Prop(format=configid_list_format),
    "force": Prop(type="boolean", requires="delete"),
    "digest": Prop(max_length=40),
}
ROUTES = [
    route("GET", "/nodes/{node}/qemu/{vmid}/config", get_config,
          {"current": BOOL, "snapshot": Prop(format=configid_list_format, max_length=40)}),
    route("PUT", "/nodes/{node}/qemu/{vmid}/config", put_config, UPDATE_PROPS),
    route("POST", "/nodes/{node}/qemu/{vmid}/config", post_config,
          {**UPDATE_PROPS, "background_delay": Prop(type="integer", minimum=1, maximum=30)}),
    route("GET", "/nodes/{node}/qemu/{vmid}/pending", get_pending),
    route("GET", "/nodes/{node}/qemu/{vmid}/cloudinit", cloudinit_pending),
    route("PUT", "/nodes/{node}/qemu/{vmid}/cloudinit", cloudinit_update),
]
