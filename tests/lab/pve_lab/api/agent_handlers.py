"""{vmid}/agent/*: ping, exec, exec-status, network-get-interfaces, delegated to the node backend.

As assert_agent_available: the agent must be enabled in the config ("No QEMU guest agent configured"), the VM
must run ("VM N is not running") and the agent must answer ("QEMU guest agent is not running").
"""

from __future__ import annotations

import base64
from typing import Dict

from pve_lab.api import vm_config
from pve_lab.api.app import App
from pve_lab.api.errors import fail
from pve_lab.api.router import Request, route
from pve_lab.api.schema import Prop, required


def _assert_agent(app: App, vmid: int) -> None:
    with app.state.lock:
        vm = app.vm(vmid)
        if not vm_config.agent_enabled(vm.config):
            raise fail("No QEMU guest agent configured")
        if not app.is_running(vm):
            raise fail("VM %d is not running" % vmid)
    try:
        answer = app.backend.agent_ping(vmid)
    except Exception:  # whatever the backend says, the agent did not answer
        answer = False
    if answer is False:
        raise fail("QEMU guest agent is not running")


def ping(app: App, p: Dict[str, object], req: Request) -> object:
    _assert_agent(app, p["vmid"])
    return {"result": {}}


def network_get_interfaces(app: App, p: Dict[str, object], req: Request) -> object:
    _assert_agent(app, p["vmid"])
    try:
        return {"result": app.backend.agent_network_interfaces(p["vmid"])}
    except Exception as err:
        raise fail("guest-network-get-interfaces failed: %s" % err)


def exec_command(app: App, p: Dict[str, object], req: Request) -> object:
    vmid = p["vmid"]
    command = list(p["command"])
    _assert_agent(app, vmid)
    if not command and p.get("input-data") is None:
        raise fail("command or input-data (or both) required")
    try:
        result = app.backend.agent_exec(vmid, command, p.get("input-data"))
    except Exception as err:
        raise fail("can't execute command (%s): %s" % (" ".join(command), err))
    return {"pid": int(result)} if isinstance(result, int) else result


def exec_status(app: App, p: Dict[str, object], req: Request) -> object:
    vmid, pid = p["vmid"], p["pid"]
    _assert_agent(app, vmid)
    try:
        result = dict(app.backend.agent_exec_status(vmid, pid))
    except Exception as err:
        raise fail("can't get exec status for '%d': %s" % (pid, err))
    for key in ("out-data", "err-data"):  # qemu_exec_status decodes the agent's base64 output
        if result.get(key):
            try:
                result[key] = base64.b64decode(result[key], validate=True).decode("utf-8", "replace")
            except (ValueError, TypeError):
                pass
    return result


def agent_index(app: App, p: Dict[str, object], req: Request) -> object:
    app.vm(p["vmid"])
    return [{"name": n} for n in ("exec", "exec-status", "network-get-interfaces", "ping")]


ROUTES = [
    route("GET", "/nodes/{node}/qemu/{vmid}/agent", agent_index),
    route("POST", "/nodes/{node}/qemu/{vmid}/agent/ping", ping),
    route("GET", "/nodes/{node}/qemu/{vmid}/agent/network-get-interfaces", network_get_interfaces),
    route("POST", "/nodes/{node}/qemu/{vmid}/agent/exec", exec_command, {
        "command": required(Prop(type="array")),
        "input-data": Prop(max_length=64 * 1024)}),
    route("GET", "/nodes/{node}/qemu/{vmid}/agent/exec-status", exec_status, {
        "pid": required(Prop(type="integer"))}),
]
