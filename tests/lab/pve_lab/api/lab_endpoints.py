"""The lab's own endpoints, outside /api2 and answered on loopback only, without authentication.

- `GET /lab/info`: which backend the server drives (`nodes`, or `no-nodes` for VMs without a guest), its pid.
- `GET /lab/faults`: the faults switched on now.
- `POST /lab/faults` (JSON), any of:
  `{"fail_next_task": "text"}` or `{"fail_next_task": {"message": "text", "type": "qmstart", "vmid": 101}}`,
  `{"fail_requests": N, "status": 503, "message": "text", "path": "/nodes/pve/qemu/123"}`, `{"task_delay": 2.5}`,
  `{"slow_requests": N, "delay": 5, "method": "POST", "path": "/nodes/pve/qemu/9000/clone"}` (answered after the
  delay, and handled all the same),
  `{"lock": {"vmid": 101, "lock": "backup"}}` (a `lock` of null removes the VM's lock),
  `{"hold_config_lock": {"vmid": 101, "seconds": 3}}` (holds the VM's config file lock exclusively for that long,
  as a long `qm set`, a clone of the running VM or a migration would; answers once the lock is held),
  `{"reset_requests": N, "method": "POST", "path": "/nodes/pve/qemu/9000/clone"}` (the next N matching requests
  are neither handled nor answered: the connection is reset),
  `{"ticket_lifetime": 3}` (tickets older than 3 s are refused, "permission denied - invalid PVE ticket", as PVE
  refuses one past its two hours; renewing with such a ticket fails too; API tokens are not affected).
- `GET /lab/acl`: the grants of the privilege-separated token `llmgw@pve!fleet` (api/permissions.py);
  `POST /lab/acl` `{"grants": {"/": ["VM.Audit", ...], "/storage/local-lvm": [...]}}` replaces them;
  `DELETE /lab/acl` restores the default (docs/real-proxmox.md's LLMGWFleet role on `/`).
- `DELETE /lab/faults`: switches every fault off (VM locks stay until removed, as they would on PVE); with a
  JSON body only what it names: `{"fail_next_task": "text", "fail_requests": true, "task_delay": true,
  "slow_requests": true, "reset_requests": true, "ticket_lifetime": true}` (the lab
  may serve several clients at once, each cleaning up its own faults).
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Dict, Tuple

from pve_lab.api.app import App
from pve_lab.api.faults import FaultError
from pve_lab.api.qemu_schema import LOCKS

Answer = Tuple[int, Dict[str, object]]


def handle(app: App, method: str, path: str, body: bytes) -> Answer:
    if path == "/lab/info" and method == "GET":
        return 200, {"data": {"backend": app.backend_kind, "node": app.node, "pid": os.getpid(),
                              "lab_dir": app.paths.lab_dir}}
    if path == "/lab/acl":
        return _acl(app, method, body)
    if path != "/lab/faults":
        return 404, {"message": "no such lab endpoint"}
    if method == "GET":
        return 200, {"data": app.faults.snapshot()}
    if method == "DELETE":
        try:
            payload = json.loads(body) if body else None
        except ValueError as err:
            return 400, {"message": str(err)}
        if isinstance(payload, dict):
            app.faults.remove(payload)
        else:
            app.faults.clear()
        return 200, {"data": app.faults.snapshot()}
    if method != "POST":
        return 405, {"message": "method not allowed"}
    try:
        payload = json.loads(body or b"{}")
        if not isinstance(payload, dict):
            raise FaultError("the body is a JSON object")
        if "lock" in payload:
            _set_lock(app, payload["lock"])
        if "hold_config_lock" in payload:
            _hold_config_lock(app, payload["hold_config_lock"])
        app.faults.update(payload)
    except (ValueError, FaultError) as err:
        return 400, {"message": str(err)}
    return 200, {"data": app.faults.snapshot()}


def _acl(app: App, method: str, body: bytes) -> Answer:
    if method == "DELETE":
        app.acl.reset()
    elif method == "POST":
        try:
            payload = json.loads(body or b"{}")
            app.acl.replace(payload.get("grants") if isinstance(payload, dict) else None)
        except ValueError as err:
            return 400, {"message": str(err)}
    elif method != "GET":
        return 405, {"message": "method not allowed"}
    return 200, {"data": app.acl.snapshot()}


def _set_lock(app: App, spec: object) -> None:
    if not isinstance(spec, dict) or "vmid" not in spec:
        raise FaultError("lock is {vmid, lock}")
    lock = spec.get("lock")
    if lock is not None and lock not in LOCKS:
        raise FaultError("lock must be one of %s" % ", ".join(LOCKS))
    with app.state.change():
        vm = app.find(int(spec["vmid"]))
        if vm is None:
            raise FaultError("VM %s does not exist" % spec["vmid"])
        if lock is None:
            vm.config.pop("lock", None)
        else:
            vm.config["lock"] = lock


def _hold_config_lock(app: App, spec: object) -> None:
    if not isinstance(spec, dict) or not isinstance(spec.get("vmid"), int) \
            or not isinstance(spec.get("seconds"), (int, float)) or not 0 < spec["seconds"] <= 600:
        raise FaultError("hold_config_lock is {vmid, seconds} with 0 < seconds <= 600")
    held = threading.Event()

    def hold() -> None:
        with app.config_locks.hold(int(spec["vmid"]), timeout=600):
            held.set()
            time.sleep(float(spec["seconds"]))

    threading.Thread(target=hold, name="lab-hold-lock", daemon=True).start()
    if not held.wait(600):
        raise FaultError("the config lock of VM %s could not be taken" % spec["vmid"])
