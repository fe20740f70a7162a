"""{vmid}/resize and {vmid}/template (qemu-server's resize_vm, template)."""

from __future__ import annotations

import re
from typing import Dict

from pve_lab.api import storage, vm_config
from pve_lab.api.app import App
from pve_lab.api.errors import TaskError, fail
from pve_lab.api.qemu_schema import DRIVE_FORMAT, DRIVE_KEYS, is_drive
from pve_lab.api.router import Request, root_only, route
from pve_lab.api.schema import Prop, required
from pve_lab.api.tasks import TaskContext


def resize(app: App, p: Dict[str, object], req: Request) -> object:
    """Grow a disk to `size`, or by `+size`; shrinking is refused as PVE refuses it."""
    vmid, key, wanted = p["vmid"], str(p["disk"]), str(p["size"])
    root_only(req, p, ["skiplock"])

    def check():
        vm = app.vm(vmid)
        if p.get("digest") and p["digest"] != vm.digest():
            raise fail("detected modified configuration - file changed by other user? Try again.")
        if vm.lock and not p.get("skiplock"):
            raise fail("VM is locked (%s)" % vm.lock)
        if key not in vm.config:
            raise fail("disk '%s' does not exist" % key)
        drive = DRIVE_FORMAT.parse(vm.config[key])
        if vm_config.is_cdrom(drive):
            raise fail("you can't resize a cdrom")
        return vm, drive

    with app.state.lock:
        check()

    def work(ctx: TaskContext) -> None:
        with app.config_locks.hold(vmid), app.state.change():
            vm, drive = check()
            size = app.state.volumes.get(drive["file"]) or storage.parse_size(drive.get("size", "0"))
            delta = storage.parse_size(wanted.lstrip("+"))
            new_size = size + delta if wanted.startswith("+") else delta
            if new_size < size:
                raise TaskError("shrinking disks is not supported")
            ctx.log("Size of logical volume %s changed from %s to %s." % (
                drive["file"], storage.format_size(size), storage.format_size(new_size)))
            app.state.volumes[drive["file"]] = new_size
            drive["size"] = storage.format_size(new_size)
            vm.config[key] = DRIVE_FORMAT.render(drive)

    return app.tasks.spawn("resize", str(vmid), req.user, work, vmid=vmid)


def make_template(app: App, p: Dict[str, object], req: Request) -> object:
    """Convert a stopped VM into a template: its disks become base images (`base-N-disk-K`)."""
    vmid = p["vmid"]
    with app.state.lock:
        vm = app.vm(vmid)
        if vm.lock:
            raise fail("VM is locked (%s)" % vm.lock)
        if vm.is_template and not p.get("disk"):
            raise fail("you can't convert a template to a template")
        if app.is_running(vm):
            raise fail("you can't convert a VM to template if VM is running")

    def work(ctx: TaskContext) -> None:
        with app.config_locks.hold(vmid), app.state.change():
            vm = app.vm(vmid)
            for key in sorted(vm.config):
                if not is_drive(key) or p.get("disk") and key != p["disk"]:
                    continue
                drive = DRIVE_FORMAT.parse(vm.config[key])
                volid = drive["file"]
                if vm_config.is_cdrom(drive) or vm_config.is_cloudinit(drive) or volid not in app.state.volumes:
                    continue
                base = re.sub(r"(^|[:/])vm-(\d+)-disk-", r"\1base-\2-disk-", volid)
                app.state.volumes[base] = app.state.volumes.pop(volid)
                drive["file"] = base
                vm.config[key] = DRIVE_FORMAT.render(drive)
                ctx.log("converting %s to base image %s" % (volid, base))
            vm.config["template"] = "1"

    return app.tasks.spawn("qmtemplate", str(vmid), req.user, work, vmid=vmid)


ROUTES = [
    route("PUT", "/nodes/{node}/qemu/{vmid}/resize", resize, {
        "disk": required(Prop(enum=sorted(DRIVE_KEYS))),
        "size": required(Prop(pattern=r"\+?\d+(\.\d+)?[KMGT]?")),
        "digest": Prop(max_length=40), "skiplock": Prop(type="boolean")}),
    route("POST", "/nodes/{node}/qemu/{vmid}/template", make_template, {"disk": Prop(enum=sorted(DRIVE_KEYS))}),
]
