"""/version, /access, /cluster/* and /nodes/{node}/* outside the VMs (pve-manager's Cluster.pm, Nodes.pm)."""

from __future__ import annotations

from typing import Dict, List

from pve_lab.api import hostinfo, permissions, storage, vm_views
from pve_lab.api.app import App
from pve_lab.api.constants import PVE_VERSION
from pve_lab.api.errors import ApiError, fail, param_error
from pve_lab.api.router import VMID_PROP, Request, route
from pve_lab.api.schema import Prop, required

NEXTID_LOWER, NEXTID_UPPER = 100, 1000000


def root_index(app: App, p: Dict[str, object], req: Request) -> object:
    return [{"subdir": s} for s in ("version", "cluster", "nodes", "storage", "access", "pools")]


def version(app: App, p: Dict[str, object], req: Request) -> object:
    return dict(PVE_VERSION)


def access_ticket_get(app: App, p: Dict[str, object], req: Request) -> object:
    return None


def access_ticket(app: App, p: Dict[str, object], req: Request) -> object:
    username = str(p["username"])
    if "@" not in username and p.get("realm"):
        username = "%s@%s" % (username, p["realm"])
    return app.auth.login(username, str(p["password"]))


def access_domains(app: App, p: Dict[str, object], req: Request) -> object:
    return [{"realm": "pam", "type": "pam", "comment": "Linux PAM standard authentication"},
            {"realm": "pve", "type": "pve", "comment": "Proxmox VE authentication server"}]


def _node_entry(app: App) -> Dict[str, object]:
    mem = hostinfo.memory()
    disk = storage.filesystem_usage()
    return {"node": app.node, "status": "online", "type": "node", "id": "node/%s" % app.node, "level": "",
            "cpu": 0.01, "maxcpu": hostinfo.cpuinfo()["cpus"], "mem": mem["used"], "maxmem": mem["total"],
            "disk": disk["used"], "maxdisk": disk["total"], "uptime": hostinfo.uptime()}


def nodes(app: App, p: Dict[str, object], req: Request) -> object:
    return [_node_entry(app)]


def node_index(app: App, p: Dict[str, object], req: Request) -> object:
    return [{"name": s} for s in ("qemu", "status", "storage", "tasks", "version")]


def node_version(app: App, p: Dict[str, object], req: Request) -> object:
    return dict(PVE_VERSION)


def node_status(app: App, p: Dict[str, object], req: Request) -> object:
    disk = storage.filesystem_usage()
    return {
        "cpu": 0.01, "wait": 0, "idle": 0,
        "cpuinfo": hostinfo.cpuinfo(),
        "memory": hostinfo.memory(), "swap": hostinfo.swap(),
        "rootfs": {"total": disk["total"], "used": disk["used"], "avail": disk["avail"],
                   "free": disk["total"] - disk["used"]},
        "uptime": hostinfo.uptime(), "loadavg": hostinfo.loadavg(), "kversion": hostinfo.kernel(),
        "pveversion": "pve-manager/%s/%s" % (PVE_VERSION["version"], PVE_VERSION["repoid"]),
        "ksm": {"shared": 0}, "boot-info": {"mode": "efi", "secureboot": 0},
    }


def _storage_entry(app: App, store: storage.Storage) -> Dict[str, object]:
    disk = storage.filesystem_usage()
    with app.state.lock:
        used = sum(size for volid, size in app.state.volumes.items() if volid.startswith(store.storeid + ":"))
    used = min(used, disk["total"]) if store.type == "lvmthin" else disk["used"]
    return {"storage": store.storeid, "type": store.type, "content": store.content, "active": 1, "enabled": 1,
            "shared": store.shared, "total": disk["total"], "used": used, "avail": disk["total"] - used,
            "used_fraction": used / disk["total"] if disk["total"] else 0}


def node_storage(app: App, p: Dict[str, object], req: Request) -> object:
    result = []
    for store in storage.STORAGES.values():
        if p.get("storage") and p["storage"] != store.storeid:
            continue
        if p.get("content") and not set(str(p["content"]).split(",")) & set(store.content.split(",")):
            continue
        result.append(_storage_entry(app, store))
    return result


def storage_status(app: App, p: Dict[str, object], req: Request) -> object:
    store = storage.STORAGES.get(str(p["storage"]))
    if store is None:
        raise fail("storage '%s' does not exist" % p["storage"])
    return _storage_entry(app, store)


def cluster_resources(app: App, p: Dict[str, object], req: Request) -> object:
    kind = p.get("type")
    result: List[Dict[str, object]] = []
    if kind in (None, "vm"):
        with app.state.lock:
            result += [vm_views.resource(app, vm, app.node) for vm in app.state.vms.values()]
    if kind in (None, "node"):
        result.append(_node_entry(app))
    if kind in (None, "storage"):
        for store in storage.STORAGES.values():
            entry = _storage_entry(app, store)
            result.append({"id": "storage/%s/%s" % (app.node, store.storeid), "type": "storage",
                           "storage": store.storeid, "node": app.node, "status": "available",
                           "plugintype": store.type, "content": store.content, "shared": store.shared,
                           "disk": entry["used"], "maxdisk": entry["total"]})
    return result


def cluster_status(app: App, p: Dict[str, object], req: Request) -> object:
    return [{"type": "node", "name": app.node, "id": "node/%s" % app.node, "nodeid": 0, "ip": "127.0.0.1",
             "local": 1, "online": 1, "level": ""}]


def access_permissions(app: App, p: Dict[str, object], req: Request) -> object:
    """pve-access-control's GET /access/permissions for the caller itself: {path: {privilege: 1}} at the path
    asked (every privilege for root@pam and its token), or at each ACL path when none is asked."""
    if p.get("userid") not in (None, req.user):
        raise ApiError(403, "Permission check failed (/access, Sys.Audit)")
    checker = permissions.Checker(app.acl, req.user)
    paths = [str(p["path"])] if p.get("path") else sorted(app.acl.snapshot()) if checker.restricted else ["/"]
    result = {}
    for path in paths:
        held = app.acl.privileges(path) if checker.restricted else permissions.KNOWN
        if held:
            result[path] = {priv: 1 for priv in sorted(held)}
    return result


def nextid(app: App, p: Dict[str, object], req: Request) -> object:
    """The first free VMID (or the asked one, if free), as a string; nothing is reserved."""
    with app.state.lock:
        used = set(app.state.vms)
    if p.get("vmid") is not None:
        if p["vmid"] in used:
            raise param_error({"vmid": "VM %d already exists" % p["vmid"]})
        return str(p["vmid"])
    for vmid in range(NEXTID_LOWER, NEXTID_UPPER):
        if vmid not in used:
            return str(vmid)
    raise fail("unable to get any free VMID in range [%d, %d]" % (NEXTID_LOWER, NEXTID_UPPER))


ROUTES = [
    route("GET", "/", root_index),
    route("GET", "/version", version),
    route("GET", "/access/ticket", access_ticket_get),
    route("POST", "/access/ticket", access_ticket, {
        "username": required(Prop(max_length=64)), "password": required(Prop()), "realm": Prop(),
        "otp": Prop(), "path": Prop(max_length=64), "privs": Prop(), "tfa-challenge": Prop(),
        "new-format": Prop(type="boolean")}),
    route("GET", "/access/domains", access_domains),
    route("GET", "/access/permissions", access_permissions, {"path": Prop(max_length=64), "userid": Prop()}),
    route("GET", "/nodes", nodes),
    route("GET", "/nodes/{node}", node_index),
    route("GET", "/nodes/{node}/version", node_version),
    route("GET", "/nodes/{node}/status", node_status),
    route("GET", "/nodes/{node}/storage", node_storage, {
        "content": Prop(), "enabled": Prop(type="boolean"), "format": Prop(type="boolean"), "storage": Prop(),
        "target": Prop()}),
    route("GET", "/nodes/{node}/storage/{storage}/status", storage_status, {"storage": required(Prop())}),
    route("GET", "/cluster/resources", cluster_resources, {"type": Prop(enum=["vm", "storage", "node", "sdn"])}),
    route("GET", "/cluster/status", cluster_status),
    route("GET", "/cluster/nextid", nextid, {"vmid": Prop(**{**VMID_PROP.__dict__, "optional": True})}),
]
