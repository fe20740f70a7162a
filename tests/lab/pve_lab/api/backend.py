"""The node backend the API server drives: the real one (`pve_lab.nodes.backend.NodeBackend`) or, with
`--no-nodes`, one whose VMs have no guest.

A VM "without a guest" starts and stops (its status flips) but nothing boots: no node, no ssh, and its guest agent
never answers ("QEMU guest agent is not running"). It exists so the API can be exercised where the node backend is
not available; the lab's conformance tests say so when they run against it.
"""

from __future__ import annotations

import inspect
import logging
from typing import Dict, List, Optional, Tuple

LOG = logging.getLogger("pve_lab.api")


class AgentNotRunning(RuntimeError):
    """The guest agent does not answer."""


class NoGuestBackend:
    kind = "no-nodes"
    tracks_guests = False  # the API's own record of running VMs is the truth

    def start(self, spec) -> None:
        LOG.info("no-nodes: VM %s marked running without a guest", spec.vmid)

    def stop(self, vmid: int) -> None:
        pass

    def destroy(self, vmid: int) -> None:
        pass

    def is_running(self, vmid: int) -> bool:
        raise NotImplementedError

    def agent_ping(self, vmid: int) -> Dict[str, object]:
        raise AgentNotRunning("no guest")

    def agent_exec(self, vmid: int, argv: List[str], input_data: Optional[str]) -> Dict[str, object]:
        raise AgentNotRunning("no guest")

    def agent_exec_status(self, vmid: int, pid: int) -> Dict[str, object]:
        raise AgentNotRunning("no guest")

    def agent_network_interfaces(self, vmid: int) -> List[Dict[str, object]]:
        raise AgentNotRunning("no guest")

    def teardown_all(self) -> None:
        pass


def node_backend_class():
    """The real backend class; raises ImportError while `pve_lab.nodes.backend` does not exist or cannot load."""
    from pve_lab.nodes.backend import NodeBackend  # lazy: the API works before the node backend is there

    return NodeBackend


def construct(cls, lab_dir: str):
    """NodeBackend(), handing it the lab directory when its constructor takes one."""
    params = inspect.signature(cls).parameters
    for name in ("state_dir", "lab_dir"):
        if name in params:
            return cls(**{name: lab_dir})
    return cls()


def load(no_nodes: bool, lab_dir: str) -> Tuple[object, str]:
    """The backend to use and its kind ("nodes" or "no-nodes")."""
    if no_nodes:
        return NoGuestBackend(), NoGuestBackend.kind
    backend = construct(node_backend_class(), lab_dir)
    return backend, "nodes"
