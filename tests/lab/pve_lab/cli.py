"""`python -m pve_lab up|down|status` (what `make lab-up`, `lab-down`, `lab-status` run).

up      idempotent: makes the lab's CA and certificate, credentials and operator ssh key, prepares the node
        backend, starts the API server if it does not run, waits until it answers, writes .lab/connection.yml.
        `--no-nodes` runs the API with VMs that have no guest (for when the node backend is not available).
down    stops the API server, tears down every node, namespace, mount and interface the lab made (also after a
        crash), and removes the lab's state; the CA, credentials and ssh key stay for the next `up`.
        `--verify` then checks that nothing is left and fails, naming it, if something is.
status  says what runs.
hostile-first-boot VMID
        arms a lab fault on a stopped container node: at its next boot, seconds after sshd answered, it replaces
        its host keys and restarts sshd while cloud-init still runs (pve_lab.nodes.hostile_boot); `--disarm`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from typing import List, Optional

import yaml

from pve_lab import pki
from pve_lab.api import backend, daemon, leftovers
from pve_lab.api.constants import (
    API_HOST,
    API_PORT,
    BRIDGE,
    DEFAULT_LAB_DIR,
    FLEET_TOKEN_ID,
    GATEWAY,
    NETWORK,
    NODE,
    TEMPLATE_NAME,
    TEMPLATE_VMID,
    TOKEN_ID,
    TOKEN_NAME,
    USER,
    LabPaths,
)
from pve_lab.api.credentials import load_or_create

RUNTIME_FILES = ("state_file", "tasks_file", "pid_file", "connection_file")


def say(message: str) -> None:
    print("lab: " + message, flush=True)


def ensure_ssh_key(paths: LabPaths) -> None:
    if os.path.exists(paths.ssh_private_key) and os.path.exists(paths.ssh_public_key):
        return
    os.makedirs(paths.ssh_dir, mode=0o700, exist_ok=True)
    for path in (paths.ssh_private_key, paths.ssh_public_key):
        if os.path.exists(path):
            os.unlink(path)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "llmgw-lab-operator", "-f",
                    paths.ssh_private_key], check=True)


def write_connection(paths: LabPaths, kind: str) -> None:
    creds = load_or_create(paths)
    data = {
        "api_host": API_HOST, "api_port": API_PORT, "api_url": "https://%s:%d/api2/json" % (API_HOST, API_PORT),
        "api_user": USER, "api_password": creds.password,
        "api_token_id": TOKEN_ID, "api_token_name": TOKEN_NAME, "api_token_secret": creds.token_secret,
        # Privilege separated, holding only what /lab/acl grants (docs/real-proxmox.md's role by default).
        "fleet_token_id": FLEET_TOKEN_ID, "fleet_token_secret": creds.fleet_token_secret,
        "ca_cert": paths.ca_cert, "pve_node": NODE, "template_vmid": TEMPLATE_VMID, "template_name": TEMPLATE_NAME,
        "network": NETWORK, "gateway": GATEWAY, "bridge": BRIDGE,
        "ssh_public_key": paths.ssh_public_key, "ssh_private_key": paths.ssh_private_key, "backend": kind,
    }
    fd = os.open(paths.connection_file + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write("# Written by `python -m pve_lab up`: how to reach the lab's Proxmox VE API.\n")
        yaml.safe_dump(data, handle, default_flow_style=False, sort_keys=False)
    os.replace(paths.connection_file + ".tmp", paths.connection_file)


def prepare_nodes() -> None:
    """Lets the node backend build what nodes need (template root, network, mirror) before the API starts."""
    node_backend = backend.construct(backend.node_backend_class(), DEFAULT_LAB_DIR)
    prepare = getattr(node_backend, "prepare", None)
    if callable(prepare):
        say("preparing the node backend")
        prepare()


def up(paths: LabPaths, no_nodes: bool) -> int:
    os.makedirs(paths.lab_dir, exist_ok=True)
    if pki.ensure(paths):
        say("made the lab's CA and the API certificate in %s" % paths.pki_dir)
    load_or_create(paths)
    ensure_ssh_key(paths)
    kind = "no-nodes" if no_nodes else "nodes"
    if not no_nodes:
        try:
            prepare_nodes()
        except ImportError as err:
            say("the node backend is not available (%s); `up --no-nodes` runs the API without guests" % err)
            return 2
    info = daemon.lab_info(paths)
    if info is not None and info.get("backend") != kind:
        say("the API server runs with backend %s; restarting it with %s" % (info.get("backend"), kind))
        daemon.stop(paths)
        info = None
    if info is None:
        daemon.stop(paths)  # a server that does not answer (hung, or half started) is replaced
        pid = daemon.start(paths, no_nodes)
        try:
            daemon.wait_answering(paths, pid)
        except RuntimeError as err:
            say(str(err))
            return 1
        say("API server started (pid %d, backend %s)" % (pid, kind))
    else:
        say("API server already running (pid %s, backend %s)" % (info.get("pid"), kind))
    write_connection(paths, kind)
    say("https://%s:%d/api2/json is up; connection details in %s" % (API_HOST, API_PORT, paths.connection_file))
    return 0


def recorded_vmids(paths: LabPaths) -> List[int]:
    """The VMs the API's state knows, read from the file (the server may have crashed)."""
    try:
        with open(paths.state_file) as handle:
            return sorted(int(vmid) for vmid in json.load(handle)["vms"])
    except (OSError, ValueError, KeyError):
        return []


def teardown_nodes(vmids: List[int]) -> None:
    """Every node process, mount and interface goes; so do the disks of the VMs the state forgets."""
    try:
        cls = backend.node_backend_class()
    except ImportError as err:
        say("no node backend to tear down (%s)" % err)
        return
    node_backend = backend.construct(cls, DEFAULT_LAB_DIR)
    node_backend.teardown_all()
    for vmid in vmids:
        node_backend.destroy(vmid)
    say("node backend torn down")


def verify_empty(paths: LabPaths, timeout: float = 10.0) -> int:
    deadline = time.monotonic() + timeout
    found = leftovers.find(paths)
    while found and time.monotonic() < deadline:  # processes take a moment to be reaped
        time.sleep(0.5)
        found = leftovers.find(paths)
    if found:
        say("left behind: " + "; ".join(found))
        return 1
    say("verified: nothing of the lab is left (processes, interfaces, namespaces, mounts, state)")
    return 0


def stop_gateway(paths: LabPaths, timeout: float = 20.0) -> Optional[int]:
    """Stop the lab gateway's HAProxy master (started by roles/gateway with gateway_service_manager: process);
    the pid it stopped, or None when none was running."""
    pid_file = os.path.join(paths.gateway_dir, "haproxy.pid")
    try:
        with open(pid_file) as handle:
            pid = int(handle.read().split()[0])
        with open("/proc/%d/comm" % pid) as handle:
            if handle.read().strip() != "haproxy":
                return None
        os.kill(pid, signal.SIGTERM)
    except (OSError, ValueError, IndexError):
        return None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and os.path.exists("/proc/%d" % pid):
        time.sleep(0.1)
    return pid


def remove_fleet_state(paths: LabPaths) -> List[str]:
    """The lab fleet's registry, known_hosts, CA and gateway go with its VMs: kept, they would describe nodes that
    no longer exist (ready in `bin/fleet status`) and refuse the same names again as changed host keys."""
    removed = []
    for directory in (paths.fleet_dir, paths.gateway_dir):
        if os.path.isdir(directory):
            shutil.rmtree(directory)
            removed.append(directory)
    return removed


def down(paths: LabPaths, verify: bool = False) -> int:
    vmids = recorded_vmids(paths)
    stopped = daemon.stop(paths)
    say("API server stopped (pid %s)" % ", ".join(map(str, stopped)) if stopped else "no API server was running")
    status = 0
    try:
        teardown_nodes(vmids)
    except Exception as err:  # state is removed anyway; the failure is reported and fails the command
        say("node teardown failed: %s" % err)
        status = 1
    for name in RUNTIME_FILES:
        path = getattr(paths, name)
        for candidate in (path, path + ".tmp"):
            if os.path.exists(candidate):
                os.unlink(candidate)
    gateway = stop_gateway(paths)
    if gateway:
        say("gateway stopped (pid %d)" % gateway)
    for directory in remove_fleet_state(paths):
        say("removed %s (the fleet state of the VMs just destroyed)" % os.path.relpath(directory, paths.lab_dir))
    say("lab state removed")
    if verify and verify_empty(paths) != 0:
        status = 1
    return status


def status(paths: LabPaths) -> int:
    pids = daemon.server_pids(paths)
    info = daemon.lab_info(paths)
    if info is None:
        say("API server: not answering" + (" (process %s exists)" % pids if pids else " (not running)"))
        return 3
    say("API server: pid %s, backend %s, https://%s:%d/api2/json" % (info["pid"], info["backend"], API_HOST,
                                                                     API_PORT))
    try:
        vms = daemon.api_get(paths, "/cluster/resources?type=vm")
    except OSError as err:
        say("cannot list VMs: %s" % err)
        return 1
    for vm in sorted(vms, key=lambda v: v["vmid"]):
        say("  qemu/%-6d %-24s %s%s" % (vm["vmid"], vm["name"], vm["status"], " (template)" if vm["template"]
                                        else ""))
    say("connection details: %s" % paths.connection_file)
    return 0


def hostile_first_boot(paths: LabPaths, args: argparse.Namespace) -> int:
    from pve_lab.nodes import hostile_boot  # the node backend's module: only this command needs it
    from pve_lab.nodes.common import LabError

    try:
        if args.disarm:
            hostile_boot.disarm(args.vmid, state_dir=paths.lab_dir)
            say("VM %d: hostile first boot disarmed" % args.vmid)
        else:
            hostile_boot.arm(args.vmid, after_s=args.after, outage_s=args.outage, trigger=args.trigger,
                             state_dir=paths.lab_dir)
            say("VM %d: its next boot replaces the host keys %.0f s after sshd %s, sshd down %.0f s"
                % (args.vmid, args.after, "answered a client" if args.trigger == "client" else "listened",
                   args.outage))
    except LabError as err:
        say("error: %s" % err)
        return 1
    return 0


def partition(args: argparse.Namespace) -> int:
    from pve_lab.nodes import network  # the node backend's module: only this command needs it
    from pve_lab.nodes.common import LabError

    try:
        link = network.partition(args.vmid, heal=args.heal)
    except LabError as err:
        say("error: %s" % err)
        return 1
    say("VM %d: %s (link %s %s)" % (args.vmid, "partition healed" if args.heal else "cut off the network", link,
                                    "up" if args.heal else "down"))
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pve_lab", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lab-dir", default=DEFAULT_LAB_DIR, help=argparse.SUPPRESS)
    commands = parser.add_subparsers(dest="command", required=True)
    up_parser = commands.add_parser("up", help="bring the lab up (idempotent)")
    up_parser.add_argument("--no-nodes", action="store_true", help="VMs without a guest (no node backend)")
    down_parser = commands.add_parser("down", help="stop and remove everything the lab made")
    down_parser.add_argument("--verify", action="store_true", help="then check that nothing is left; fail if so")
    commands.add_parser("status", help="say what runs")
    hostile = commands.add_parser("hostile-first-boot", help="make a stopped node's next boot replace its host keys")
    hostile.add_argument("vmid", type=int)
    hostile.add_argument("--after", type=float, default=8.0, help="seconds after the trigger (default 8)")
    hostile.add_argument("--outage", type=float, default=5.0, help="seconds sshd stays down (default 5)")
    hostile.add_argument("--trigger", choices=["listening", "client"], default="listening",
                         help="count from sshd listening, or from its first client from outside the node")
    hostile.add_argument("--disarm", action="store_true", help="remove the fault instead")
    cut = commands.add_parser("partition", help="cut a running node off the network (it keeps running), or heal it")
    cut.add_argument("vmid", type=int)
    cut.add_argument("--heal", action="store_true", help="put it back on the network")
    args = parser.parse_args(argv)
    paths = LabPaths(os.path.abspath(args.lab_dir))
    if args.command == "partition":
        return partition(args)
    if args.command == "hostile-first-boot":
        return hostile_first_boot(paths, args)
    if args.command == "up":
        return up(paths, args.no_nodes)
    if args.command == "down":
        return down(paths, args.verify)
    return status(paths)


if __name__ == "__main__":
    sys.exit(main())
