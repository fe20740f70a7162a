"""NodeBackend: what the lab's API server calls to turn a started VM into a machine on this host.

`cpu: host` runs as a systemd-nspawn container (container.py), any other model as a QEMU TCG guest (qemu.py).
Running nodes are found by looking (process markers, mounts, interface names), never from memory, so a new
backend, or `teardown_all` after a crash, sees exactly what exists.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import threading
import time
from typing import Any, Dict, List, Optional, Union

from pve_lab.nodes import container, mirror, network, qemu, qga
from pve_lab.nodes.common import (
    CACHE_DIR,
    DEFAULT_STATE_DIR,
    MOUNT_SOURCE_PREFIX,
    LabError,
    is_mounted,
    kill,
    lab_processes,
    mounts,
    terminate,
    unmount,
    wait_gone,
    write_file,
)
from pve_lab.nodes.qga import AgentError, AgentNotRunning
from pve_lab.nodes.spec import VMSpec
from pve_lab.nodes.template import MIRROR_PACKAGES, Template

__all__ = ["AgentError", "AgentNotRunning", "LabError", "NodeBackend"]


class NodeBackend:
    def __init__(self, state_dir: Optional[str] = None, cache_dir: str = CACHE_DIR,
                 mirror_packages=MIRROR_PACKAGES):
        self.state_dir = os.path.abspath(state_dir or DEFAULT_STATE_DIR)
        self.nodes_dir = os.path.join(self.state_dir, "nodes")
        self.template = Template(cache_dir, mirror_packages)
        self._locks: Dict[int, threading.Lock] = {}
        self._locks_guard = threading.Lock()
        self._host_lock = threading.Lock()  # bridge and mirror are shared by every VM

    # -- lab lifecycle -------------------------------------------------------------------------------------

    def prepare(self) -> None:
        """Template (built once, cached), bridge, mirror: idempotent, cheap when all exist."""
        with self._host_lock:
            self.template.ensure()
            network.ensure_bridge()
            mirror.ensure_serving(self.template.mirror_dir, self._mirror_log())

    def _mirror_log(self) -> str:
        return os.path.join(self.state_dir, "mirror.log")

    def teardown_all(self) -> None:
        """Stop every node and remove every process, mount, namespace and interface the lab made."""
        for proc in lab_processes(role=container.ROLE):
            if proc.vmid is not None:
                leader = container.leader_pid(proc.vmid)
                if leader is not None:
                    kill(leader)
            if not wait_gone(proc.pid, 10):
                kill(proc.pid)
        for proc in lab_processes():
            terminate(proc.pid, grace=5)
        lab_paths = (self.nodes_dir + os.sep, self.template.dir + os.sep, self.template.dir + ".build" + os.sep,
                     "/run/netns/" + MOUNT_SOURCE_PREFIX)
        leftovers = [m["target"] for m in mounts()
                     if m["source"].startswith(MOUNT_SOURCE_PREFIX) or m["target"].startswith(lab_paths)]
        for target in sorted(set(leftovers), key=len, reverse=True):
            unmount(target)
        network.teardown()
        if os.path.isdir(self.nodes_dir):
            for vmid in os.listdir(self.nodes_dir):
                for name in ("qmp.sock", "qga.sock", "qemu.pid"):
                    path = os.path.join(self.nodes_dir, vmid, name)
                    if os.path.lexists(path):
                        os.remove(path)

    # -- VMs -----------------------------------------------------------------------------------------------

    def node_dir(self, vmid: int) -> str:
        return os.path.join(self.nodes_dir, str(vmid))

    def console_log(self, vmid: int) -> str:
        return os.path.join(self.node_dir(vmid), "console.log")

    def _lock(self, vmid: int) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault(vmid, threading.Lock())

    def _saved_spec(self, vmid: int) -> Optional[Dict[str, Any]]:
        try:
            with open(os.path.join(self.node_dir(vmid), "spec.json")) as handle:
                return json.load(handle)
        except (OSError, ValueError):
            return None

    def start(self, spec: VMSpec) -> None:
        """Launch the node (returns once it runs, not once it answers ssh)."""
        with self._lock(spec.vmid):
            if self.is_running(spec.vmid):
                raise LabError("VM %d already running" % spec.vmid)
            if spec.has_os and not self.template.is_current():
                raise LabError("the node template is not built: run prepare() (lab up) first")
            with self._host_lock:
                network.ensure_bridge()
                if spec.has_os:
                    mirror.ensure_serving(self.template.mirror_dir, self._mirror_log())
            node_dir = self.node_dir(spec.vmid)
            os.makedirs(node_dir, exist_ok=True)
            kind = container.ROLE if spec.runs_as_container and spec.has_os else qemu.ROLE
            record = dict(spec.__dict__, kind=kind, started=time.time())
            write_file(os.path.join(node_dir, "spec.json"), json.dumps(record, indent=1))
            if kind == container.ROLE:
                container.start(spec, node_dir, self.template)
            else:
                qemu.start(spec, node_dir, self.template)

    def stop(self, vmid: int) -> None:
        """Hard stop, as `qm stop`; idempotent."""
        with self._lock(vmid):
            self._stop(vmid)

    def _stop(self, vmid: int) -> None:
        node_dir = self.node_dir(vmid)
        container.stop(vmid, node_dir)
        qemu.stop(vmid, node_dir)

    def shutdown(self, vmid: int, timeout: float = 60.0) -> bool:
        """Orderly shutdown (agent if configured, else the power button), hard stop after ``timeout``.

        Returns True when the guest went down by itself."""
        with self._lock(vmid):
            if not self.is_running(vmid):
                return True
            saved = self._saved_spec(vmid) or {}
            if saved.get("agent"):
                try:
                    qga.command(self._agent_socket(vmid), "guest-shutdown", {"mode": "powerdown"}, timeout=2)
                except (AgentNotRunning, AgentError):
                    pass  # guest-shutdown does not reply when it works, so silence proves nothing
            # the power button as well: harmless when the agent already acted, the way out when it did not
            if saved.get("kind") == container.ROLE:
                container.request_poweroff(vmid)
            else:
                qemu.request_poweroff(self.node_dir(vmid))
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if not self.is_running(vmid):
                    self._stop(vmid)  # releases the overlay, namespace or tap
                    return True
                time.sleep(0.5)
            self._stop(vmid)
            return False

    def destroy(self, vmid: int) -> None:
        """Stop and remove the node's disk (overlay or qcow2) and seed; idempotent."""
        with self._lock(vmid):
            self._stop(vmid)
            node_dir = self.node_dir(vmid)
            if os.path.isdir(node_dir):
                root = container.root_dir(node_dir)
                unmount(root)
                if is_mounted(root):
                    raise LabError("cannot remove VM %d's disk: %s is still mounted" % (vmid, root))
                shutil.rmtree(node_dir)

    def is_running(self, vmid: int) -> bool:
        return container.is_running(vmid) or qemu.is_running(vmid)

    # -- guest agent (QGA shapes, as PVE's agent endpoints return them) -------------------------------------

    def _agent_socket(self, vmid: int) -> str:
        saved = self._saved_spec(vmid)
        if not self.is_running(vmid) or saved is None or not saved.get("agent"):
            raise AgentNotRunning("QEMU guest agent is not running")
        if saved.get("kind") == container.ROLE:
            path = container.agent_socket(vmid)
            if path is None:
                raise AgentNotRunning("QEMU guest agent is not running")
            return path
        return qemu.agent_socket(self.node_dir(vmid))

    def _agent(self, vmid: int, execute: str, arguments: Optional[Dict[str, Any]] = None,
               timeout: float = 10.0) -> Any:
        path = self._agent_socket(vmid)
        with self._lock_agent(vmid):
            return qga.command(path, execute, arguments, timeout=timeout)

    def _lock_agent(self, vmid: int) -> threading.Lock:
        return self._lock(-vmid)  # one QGA conversation at a time per VM, independent of start/stop

    def agent_ping(self, vmid: int) -> Dict[str, Any]:
        result = self._agent(vmid, "guest-ping")
        return result if isinstance(result, dict) else {}

    def agent_exec(self, vmid: int, argv: List[str], input_data: Optional[Union[str, bytes]] = None
                   ) -> Dict[str, int]:
        if not argv:
            raise AgentError("GenericError", "command is empty")
        arguments: Dict[str, Any] = {"path": argv[0], "arg": list(argv[1:]), "capture-output": True}
        if input_data is not None:
            raw = input_data.encode() if isinstance(input_data, str) else input_data
            arguments["input-data"] = base64.b64encode(raw).decode()
        return self._agent(vmid, "guest-exec", arguments)

    def agent_exec_status(self, vmid: int, pid: int) -> Dict[str, Any]:
        return self._agent(vmid, "guest-exec-status", {"pid": int(pid)})

    def agent_network_interfaces(self, vmid: int) -> List[Dict[str, Any]]:
        return self._agent(vmid, "guest-network-get-interfaces")
