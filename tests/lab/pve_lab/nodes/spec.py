"""What the API server hands the node backend when a VM starts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class VMSpec:
    vmid: int
    name: str
    cpu: Optional[str]  # None: no `cpu` key in the config, which PVE runs as kvm64
    cores: int
    memory: int  # MiB
    has_os: bool  # cloned (directly or not) from the lab's cloud-init template
    agent: bool
    ciuser: Optional[str]
    sshkeys: Optional[str]  # decoded (PVE stores it URL-encoded)
    ipconfig0: Optional[str]  # e.g. "ip=10.77.0.105/24,gw=10.77.0.1"
    nameserver: Optional[str]
    searchdomain: Optional[str]
    instance_id: str  # changes when the VM is re-created, as the NoCloud instance-id does on PVE

    @property
    def cpu_model(self) -> str:
        return self.cpu.split(",")[0] if self.cpu else "kvm64"

    @property
    def runs_as_container(self) -> bool:
        """Only a host-model guest sees this machine's CPU, which is what a container shows."""
        return self.cpu_model == "host"
