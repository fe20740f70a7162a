"""Fixed facts of the lab's Proxmox VE API (also written to .lab/connection.yml by `lab up`)."""

from __future__ import annotations

import os
from dataclasses import dataclass

API_HOST = "127.0.0.1"
API_PORT = 8006
NODE = "pve"
USER = "root@pam"
TOKEN_NAME = "llmgw"
TOKEN_ID = "%s!%s" % (USER, TOKEN_NAME)
# The privilege-separated token, restricted to what the ACL grants (api/permissions.py).
FLEET_USER = "llmgw@pve"
FLEET_TOKEN_NAME = "fleet"
FLEET_TOKEN_ID = "%s!%s" % (FLEET_USER, FLEET_TOKEN_NAME)
TEMPLATE_VMID = 9000
TEMPLATE_NAME = "debian12-cloudinit"
BRIDGE = "vmbr0"  # the bridge name a PVE config uses; the node backend maps it onto its own lab bridge
NETWORK = "10.77.0.0/24"
GATEWAY = "10.77.0.1"
MAC_PREFIX = "BC:24:11"  # Proxmox's OUI, which PVE 8 uses for random MACs

PVE_VERSION = {"version": "8.4.1", "release": "8.4", "repoid": "2a5fa54a8503f96d"}
QEMU_VERSION = "9.2.0"
MACHINE = "pc-i440fx-9.2+pve1"

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))))
DEFAULT_LAB_DIR = os.path.join(REPO_ROOT, ".lab")


@dataclass(frozen=True)
class LabPaths:
    """Where the API side of the lab keeps its files under the lab directory (`.lab/`)."""

    lab_dir: str

    @property
    def api_dir(self) -> str:
        return os.path.join(self.lab_dir, "api")

    @property
    def pki_dir(self) -> str:
        return os.path.join(self.lab_dir, "pki")

    @property
    def ssh_dir(self) -> str:
        return os.path.join(self.lab_dir, "ssh")

    @property
    def fleet_dir(self) -> str:
        """The lab fleet's registry, known_hosts and CA (inventories/lab points its fleet_* paths here)."""
        return os.path.join(self.lab_dir, "fleet")

    @property
    def gateway_dir(self) -> str:
        """The lab gateway's files and its HAProxy master's pid (inventories/lab/group_vars/gateway.yml)."""
        return os.path.join(self.lab_dir, "gateway")

    @property
    def state_file(self) -> str:
        return os.path.join(self.api_dir, "state.json")

    @property
    def tasks_file(self) -> str:
        return os.path.join(self.api_dir, "tasks.json")

    @property
    def secrets_file(self) -> str:
        return os.path.join(self.api_dir, "secrets.json")

    @property
    def pid_file(self) -> str:
        return os.path.join(self.api_dir, "server.pid")

    @property
    def log_file(self) -> str:
        return os.path.join(self.api_dir, "server.log")

    @property
    def ca_cert(self) -> str:
        return os.path.join(self.pki_dir, "ca.pem")

    @property
    def ca_key(self) -> str:
        return os.path.join(self.pki_dir, "ca.key")

    @property
    def server_cert(self) -> str:
        return os.path.join(self.pki_dir, "server.pem")

    @property
    def server_key(self) -> str:
        return os.path.join(self.pki_dir, "server.key")

    @property
    def ssh_private_key(self) -> str:
        return os.path.join(self.ssh_dir, "id_ed25519")

    @property
    def ssh_public_key(self) -> str:
        return self.ssh_private_key + ".pub"

    @property
    def connection_file(self) -> str:
        return os.path.join(self.lab_dir, "connection.yml")
