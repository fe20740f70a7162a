"""`make demo`: the main job on the embedded lab, shown to a newcomer, with the time it took.

Brings the lab up, clones two VMs from the lab's cloud-init template through the Proxmox VE API (proxmoxer, as
any client would), starts them, waits until each answers ssh as its own name with cloud-init finished, and tears
everything down.
"""

import os
import subprocess
import sys
import time
import urllib.parse

import yaml
from proxmoxer import ProxmoxAPI
from proxmoxer.tools import Tasks

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = sys.executable
NODES = [("node01", "10.77.0.101"), ("node02", "10.77.0.102")]
VMID_BASE = 1000


def lab(*args):
    subprocess.check_call([PY, "-m", "pve_lab"] + list(args), cwd=REPO)


def connect(conn):
    os.environ["REQUESTS_CA_BUNDLE"] = conn["ca_cert"]
    user, token = conn["api_token_id"].split("!")
    return ProxmoxAPI(conn["api_host"], port=conn["api_port"], user=user, token_name=token,
                      token_value=conn["api_token_secret"], verify_ssl=True)


def wait_task(api, conn, upid):
    status = Tasks.blocking_status(api, upid, timeout=600)
    if status.get("exitstatus") != "OK":
        raise SystemExit("task {} ended: {}".format(upid, status.get("exitstatus")))


def ssh(conn, address, command, known_hosts):
    return subprocess.run(
        ["ssh", "-i", conn["ssh_private_key"], "-o", "BatchMode=yes", "-o", "ConnectTimeout=3",
         "-o", "StrictHostKeyChecking=accept-new", "-o", "UserKnownHostsFile=" + known_hosts,
         "debian@" + address, command], capture_output=True, text=True, check=False)


def wait_ssh(conn, name, address, known_hosts, deadline):
    while time.monotonic() < deadline:
        result = ssh(conn, address, "cloud-init status --wait >/dev/null; hostname", known_hosts)
        if result.returncode == 0 and result.stdout.strip() == name:
            return
        time.sleep(2)
    raise SystemExit(f"{name} ({address}) did not answer ssh in time: {result.stderr.strip()}")


def main():
    started = time.monotonic()
    lab("up")
    with open(os.path.join(REPO, ".lab", "connection.yml")) as handle:
        conn = yaml.safe_load(handle)
    api = connect(conn)
    node = api.nodes(conn["pve_node"])
    with open(conn["ssh_public_key"]) as handle:
        sshkeys = urllib.parse.quote(handle.read().strip(), safe="")
    known_hosts = os.path.join(REPO, ".lab", "demo_known_hosts")
    if os.path.exists(known_hosts):
        os.remove(known_hosts)
    vmids = []
    try:
        for name, address in NODES:
            vmid = VMID_BASE + int(address.rsplit(".", 1)[1])
            print("clone {} -> {} ({})".format(conn["template_vmid"], vmid, name), flush=True)
            wait_task(api, conn, node.qemu(conn["template_vmid"]).clone.post(newid=vmid, name=name, full=1))
            vmids.append(vmid)
            node.qemu(vmid).config.put(
                cpu="host", ciuser="debian", sshkeys=sshkeys,
                ipconfig0="ip={}/24,gw={}".format(address, conn["gateway"]))
            wait_task(api, conn, node.qemu(vmid).status.start.post())
        for name, address in NODES:
            wait_ssh(conn, name, address, known_hosts, time.monotonic() + 180)
            print(f"{name} answers ssh at {address} as {name!r}, cloud-init done", flush=True)
        for entry in api.cluster.resources.get(type="vm"):
            print("  qemu/{vmid:<5} {name:<20} {status}".format(**entry))
    finally:
        for vmid in vmids:
            wait_task(api, conn, node.qemu(vmid).status.stop.post())
            wait_task(api, conn, node.qemu(vmid).delete(purge=1))
        lab("down")
    print(f"demo finished in {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
