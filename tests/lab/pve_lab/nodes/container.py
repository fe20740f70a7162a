"""A host-model VM: the template booted with real systemd under systemd-nspawn, on an overlay of its own.

`--keep-unit --register=no` because this host has no systemd of its own to register with. The container cannot
configure its links (nspawn drops CAP_NET_ADMIN unless it made the namespace itself), so its address is set
from the host with `ip -n`.
"""

from __future__ import annotations

import os
import signal
from typing import Optional

from pve_lab.nodes import cloudinit, network
from pve_lab.nodes.common import (
    MOUNT_SOURCE_PREFIX,
    LabError,
    children,
    is_alive,
    is_mounted,
    kill,
    lab_processes,
    run,
    spawn,
    unmount,
    wait_gone,
)
from pve_lab.nodes.spec import VMSpec
from pve_lab.nodes.template import CONTAINER_AGENT_SOCKET, Template

ROLE = "container"


def root_dir(node_dir: str) -> str:
    return os.path.join(node_dir, "root")


def start(spec: VMSpec, node_dir: str, template: Template) -> int:
    upper, work, root = (os.path.join(node_dir, d) for d in ("upper", "work", "root"))
    for path in (upper, work, root):
        os.makedirs(path, exist_ok=True)
    if not is_mounted(root):
        run(["mount", "-t", "overlay", "%s%d" % (MOUNT_SOURCE_PREFIX, spec.vmid), "-o",
             "lowerdir=%s,upperdir=%s,workdir=%s" % (template.rootfs, upper, work), root])
    # PVE regenerates the cloud-init drive at every start; cloud-init decides from the instance-id what to redo.
    cloudinit.write_seed_dir(spec, os.path.join(root, "var/lib/cloud/seed/nocloud"))
    ns = network.setup_container_netns(spec.vmid, cloudinit.mac_of(spec), cloudinit.parse_ipconfig(spec.ipconfig0))
    # With only --network-namespace-path, nspawn mounts a /sys that lists the host's interfaces (and cloud-init
    # then misses eth0's MAC); started inside the namespace, its /sys is the node's own.
    argv = [
        "nsenter", "--net=/run/netns/%s" % ns, "systemd-nspawn", "--boot", "--keep-unit", "--register=no",
        "--machine=%s" % ns, "--directory=%s" % root, "--network-namespace-path=/run/netns/%s" % ns,
        "--console=read-only", "--resolv-conf=off", "--timezone=off", "--link-journal=no",
    ]
    proc = spawn(argv, os.path.join(node_dir, "console.log"), ROLE, spec.vmid)
    if wait_gone(proc.pid, 0.3):
        stop(spec.vmid, node_dir)
        raise LabError("systemd-nspawn exited at once for VM %d: see %s" % (spec.vmid,
                                                                            os.path.join(node_dir, "console.log")))
    return proc.pid


def nspawn_pid(vmid: int) -> Optional[int]:
    procs = lab_processes(role=ROLE, vmid=vmid)
    return procs[0].pid if procs else None


def leader_pid(vmid: int) -> Optional[int]:
    """The container's PID 1 (systemd), as the host sees it: the child of nspawn in a new PID namespace."""
    nspawn = nspawn_pid(vmid)
    if nspawn is None:
        return None
    for child in children(nspawn):
        try:
            with open("/proc/%d/status" % child) as handle:
                for line in handle:
                    if line.startswith("NSpid:") and line.split()[-1] == "1":
                        return child
        except OSError:
            continue
    return None


def agent_socket(vmid: int) -> Optional[str]:
    leader = leader_pid(vmid)
    if leader is None:
        return None
    return "/proc/%d/root%s" % (leader, CONTAINER_AGENT_SOCKET)


def is_running(vmid: int) -> bool:
    pid = nspawn_pid(vmid)
    return pid is not None and is_alive(pid)


def request_poweroff(vmid: int) -> bool:
    """An orderly shutdown, as ACPI's power button asks one: SIGRTMIN+4 makes systemd power off."""
    leader = leader_pid(vmid)
    if leader is None:
        return False
    kill(leader, signal.SIGRTMIN + 4)
    return True


def stop(vmid: int, node_dir: str) -> None:
    """Hard stop: kill the container's PID 1 (and so its whole PID namespace), then let nspawn exit."""
    for proc in lab_processes(role=ROLE, vmid=vmid):
        leader = leader_pid(vmid)
        if leader is not None:
            kill(leader, signal.SIGKILL)
        if not wait_gone(proc.pid, 10):
            kill(proc.pid, signal.SIGKILL)
            wait_gone(proc.pid, 5)
    unmount(root_dir(node_dir))
    network.remove_container_netns(vmid)
