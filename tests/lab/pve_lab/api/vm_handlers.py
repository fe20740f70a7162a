"""VM lists, create, clone and destroy (qemu-server PVE/API2/Qemu.pm: vmlist, create_vm, clone_vm, destroy_vm)."""

from __future__ import annotations

import re
from typing import Dict

from pve_lab.api import config_checks, storage, vm_config, vm_views
from pve_lab.api.app import App
from pve_lab.api.errors import ApiError, TaskError, fail
from pve_lab.api.qemu_schema import CONFIG_PROPS, DRIVE_FORMAT, NET_FORMAT, is_drive
from pve_lab.api.router import VMID_PROP, Request, root_only, root_only_config, route
from pve_lab.api.schema import Prop, configid_list_format, dns_name_format, node_format, storage_id_format
from pve_lab.api.state import VM
from pve_lab.api.tasks import TaskContext

BOOL = Prop(type="boolean")
STORAGE_PROP = Prop(format=storage_id_format)
SKIP_ON_CLONE = {"snapshots", "parent", "snaptime", "vmstate", "snapstate", "runningcpu", "runningmachine",
                 "running-nets-host-mtu", "lock"}


def vmlist(app: App, p: Dict[str, object], req: Request) -> object:
    with app.state.lock:
        return [vm_views.status(app, vm) for vm in app.state.vms.values()]


def vmdiridx(app: App, p: Dict[str, object], req: Request) -> object:
    app.vm(p["vmid"])
    return [{"subdir": s} for s in ("config", "pending", "status", "unlink", "vncproxy", "termproxy", "migrate",
                                    "resize", "move", "rrd", "rrddata", "monitor", "agent", "snapshot",
                                    "spiceproxy", "sendkey", "firewall")]


def create_vm(app: App, p: Dict[str, object], req: Request) -> object:
    vmid = p["vmid"]
    root_only_config(req, p)
    if p.get("archive"):
        raise fail("unable to restore VM %d - the lab has no backups to restore from" % vmid)
    if p.get("pool"):
        raise fail("pool '%s' does not exist" % p["pool"])
    default_storage = p.get("storage")
    with app.state.change():
        params = config_checks.prepare(app.state, config_checks.config_params(p), default_storage)
        if vmid in app.state.vms:
            raise fail("unable to create VM %d - VM %d already exists on node '%s'" % (vmid, vmid, app.node))
        app.state.vms[vmid] = VM(vmid, {})

    def work(ctx: TaskContext) -> None:
        with app.config_locks.hold(vmid), app.state.change():
            conf = dict(params)
            for key in sorted(conf):
                if is_drive(key):
                    conf[key] = vm_config.create_drive(app.state, vmid, key, conf[key], default_storage)
            vm_config.finish_new_config(conf)
            app.state.vms[vmid].config = conf
        if p.get("start"):
            ctx.log("Execute autostart")
            from pve_lab.api import power

            try:
                power.start(app, vmid, ctx)
            except Exception as err:  # PVE warns and keeps the created VM
                ctx.warn(str(err))

    def on_error(message: str) -> str:
        _remove(app, vmid)
        return "unable to create VM %d - %s" % (vmid, message)

    return app.tasks.spawn("qmcreate", str(vmid), req.user, work, vmid=vmid, on_error=on_error)


def _remove(app: App, vmid: int) -> None:
    with app.state.change():
        vm = app.state.vms.pop(vmid, None)
        if vm is not None:
            vm_config.release_volumes(app.state, vm)


def _storeid(volid: str) -> str:
    return volid.split(":", 1)[0]


def _check_clone(app: App, p: Dict[str, object], source: VM) -> bool:
    """clone_vm's early checks; returns whether the clone is full."""
    target = p.get("target")
    if target and target not in (app.node, "localhost"):
        raise fail("no such cluster node '%s'" % target)
    if p.get("pool"):
        raise fail("pool '%s' does not exist" % p["pool"])
    if p.get("storage"):
        storage.image_storage(str(p["storage"]))
    if source.lock:
        raise fail("VM is locked (%s)" % source.lock)
    if p.get("snapname"):
        raise fail("snapshot '%s' does not exist" % p["snapname"])
    full = bool(p["full"]) if "full" in p else not source.is_template
    for name in ("storage", "format"):
        if p.get(name) and not full:
            raise fail("parameter '%s' not allowed for linked clones" % name)
    for key, value in sorted(source.config.items()):
        if is_drive(key):
            drive = DRIVE_FORMAT.parse(value)
            if not full and not source.is_template and not vm_config.is_cdrom(drive):
                raise fail("Linked clone feature is not supported for '%s' (%s)" % (drive["file"], key))
    if p["newid"] in app.state.vms:
        raise fail("unable to create VM %d: config file already exists" % p["newid"])
    return full


def _clone_config(app: App, p: Dict[str, object], source: VM, full: bool, ctx: TaskContext) -> Dict[str, str]:
    newid = p["newid"]
    conf: Dict[str, str] = {"lock": "clone"}
    for key, value in sorted(source.config.items()):
        if key in SKIP_ON_CLONE or re.match(r"^unused\d+$", key):
            continue
        if re.match(r"^net\d+$", key):
            net = NET_FORMAT.parse(value)
            net["macaddr"] = vm_config.random_mac()
            conf[key] = NET_FORMAT.render(net)
        elif is_drive(key):
            drive = DRIVE_FORMAT.parse(value)
            if vm_config.is_cloudinit(drive):
                drive["file"] = vm_config.cloudinit_volume(app.state, str(p.get("storage") or _storeid(
                    drive["file"])), newid)
            elif not vm_config.is_cdrom(drive):
                size = app.state.volumes.get(drive["file"]) or storage.parse_size(drive.get("size", "0"))
                ctx.log("create %s clone of drive %s (%s)" % ("full" if full else "linked", key, drive["file"]))
                storeid = str(p.get("storage") or _storeid(drive["file"])) if full else _storeid(drive["file"])
                drive["file"] = vm_config.allocate(app.state, storeid, newid, size, p.get("format") if full else None)
                drive["size"] = storage.format_size(size)
            conf[key] = DRIVE_FORMAT.render(drive)
        else:
            conf[key] = value
    smbios = re.sub(r"(^|,)uuid=[^,]*", "", conf.get("smbios1", "")).strip(",")
    conf["smbios1"] = "uuid=%s%s" % (vm_config.new_uuid(), "," + smbios if smbios else "")
    if "vmgenid" in conf:
        conf["vmgenid"] = vm_config.new_uuid()
    conf.pop("template", None)
    conf["name"] = str(p.get("name") or "Copy-of-VM-%s" % (source.config.get("name") or source.vmid))
    if p.get("description"):
        conf["description"] = str(p["description"])
    return conf


# clone_vm's locks (qemu-server PVE/API2/Qemu.pm, clone_vm): the worker takes the source's config lock, shared
# when the source is not running (a template never is) and exclusive when it is, then the new VMID's lock,
# exclusive; both with lock_config_full's timeout of 1 s, held for the whole clone. Clones of one stopped template
# therefore run side by side; a clone of a VM whose config lock another operation holds ends in TASK ERROR
# "can't lock file '/var/lock/qemu-server/lock-<vmid>.conf' - got timeout" after 1 s, with nothing created.
# Disk allocation serialises per storage in pve-storage (cluster_lock_storage, around alloc_image/clone_image
# only); here the state lock around _clone_config does that.
CLONE_LOCK_TIMEOUT = 1.0


def clone_vm(app: App, p: Dict[str, object], req: Request) -> object:
    vmid, newid = p["vmid"], p["newid"]
    with app.state.lock:
        source = app.find(vmid)
        if source is None:
            raise fail("unable to find configuration file for VM %d on node '%s'" % (vmid, app.node))
        _check_clone(app, p, source)  # load_and_check before forking, again inside the locks
        running = source.status == "running"
    created = []

    def work(ctx: TaskContext) -> None:
        with app.config_locks.hold(vmid, CLONE_LOCK_TIMEOUT, shared=not running), \
                app.config_locks.hold(newid, CLONE_LOCK_TIMEOUT):
            with app.state.change():
                source_now = app.find(vmid)
                if source_now is None:
                    raise TaskError("Configuration file 'nodes/%s/qemu-server/%d.conf' does not exist"
                                    % (app.node, vmid))
                full = _check_clone(app, p, source_now)
                ctx.log("create %s clone of VM %d with ID %d" % ("full" if full else "linked", vmid, newid))
                # qmclone's temporary config: the new VM exists, locked, from here until the clone ends
                app.state.vms[newid] = VM(newid, {"lock": "clone"}, has_os=source_now.has_os)
                created.append(newid)
                if source_now.pending:
                    ctx.warn("found pending changes for '%s', discarding for clone" % ",".join(source_now.pending))
                app.state.vms[newid].config = _clone_config(app, p, source_now, full, ctx)
            ctx.fault_point()  # the disk copy
            with app.state.change():
                app.state.vms[newid].config.pop("lock", None)

    def on_error(message: str) -> str:
        if not created:  # refused before the temporary config: nothing to remove, the error as it was raised
            return message
        _remove(app, newid)
        return "clone failed: %s" % message

    return app.tasks.spawn("qmclone", str(vmid), req.user, work, vmid=newid, on_error=on_error, faults_inside=True)


def destroy_vm(app: App, p: Dict[str, object], req: Request) -> object:
    vmid = p["vmid"]
    root_only(req, p, ["skiplock"])

    def early_checks() -> VM:
        vm = app.vm(vmid)
        if vm.config.get("protection") == "1":
            raise fail("can't remove VM %d - protection mode enabled" % vmid)
        if app.is_running(vm):
            raise fail("VM %d is running - destroy failed" % vmid)
        return vm

    with app.state.lock:
        early_checks()

    def work(ctx: TaskContext) -> None:
        with app.config_locks.hold(vmid):
            with app.state.change():
                try:
                    vm = early_checks()
                except ApiError as err:
                    raise TaskError(err.message)
                if vm.lock and not p.get("skiplock"):
                    raise TaskError("VM is locked (%s)" % vm.lock)
            app.backend.destroy(vmid)
            _remove(app, vmid)
            if p.get("purge"):
                ctx.log("purging VM %d from related configurations.." % vmid)

    return app.tasks.spawn("qmdestroy", str(vmid), req.user, work, vmid=vmid)


CREATE_PROPS = {
    **CONFIG_PROPS,
    "vmid": VMID_PROP,
    "archive": Prop(max_length=255),
    "storage": STORAGE_PROP,
    "force": Prop(type="boolean", requires="archive"),
    "unique": Prop(type="boolean", requires="archive"),
    "live-restore": BOOL,
    "pool": Prop(),
    "bwlimit": Prop(type="integer", minimum=0),
    "start": BOOL,
    "ha-managed": BOOL,
    "import-working-storage": STORAGE_PROP,
}
CLONE_PROPS = {
    "newid": VMID_PROP,
    "name": Prop(format=dns_name_format),
    "description": Prop(),
    "pool": Prop(),
    "snapname": Prop(format=configid_list_format, max_length=40),
    "storage": STORAGE_PROP,
    "format": Prop(enum=["raw", "qcow2", "vmdk"]),
    "full": BOOL,
    "target": Prop(format=node_format),
    "bwlimit": Prop(type="integer", minimum=0),
}
ROUTES = [
    route("GET", "/nodes/{node}/qemu", vmlist, {"full": BOOL}),
    route("POST", "/nodes/{node}/qemu", create_vm, CREATE_PROPS),
    route("GET", "/nodes/{node}/qemu/{vmid}", vmdiridx),
    route("POST", "/nodes/{node}/qemu/{vmid}/clone", clone_vm, CLONE_PROPS),
    route("DELETE", "/nodes/{node}/qemu/{vmid}", destroy_vm,
          {"skiplock": BOOL, "purge": BOOL, "destroy-unreferenced-disks": BOOL}),
]
