"""What the API server hands the node backend when a VM starts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional


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
    macaddr: Optional[str] = None  # net0's MAC; None: the backend derives a stable one from the vmid
    ciupgrade: Optional[bool] = None  # None: PVE's default (1), which writes `package_upgrade: true`

    @property
    def cpu_model(self) -> str:
        return cpu_options(self.cpu).get("cputype", "kvm64")

    @property
    def runs_as_container(self) -> bool:
        """Only a host-model guest sees this machine's CPU, which is what a container shows."""
        return self.cpu_model == "host"


def cpu_options(cpu: Optional[str]) -> Dict[str, str]:
    """PVE's `cpu` property string as a dict: `host`, `cputype=x86-64-v3,flags=+aes;-pcid`..."""
    options: Dict[str, str] = {}
    for item in (cpu or "").split(","):
        if not item:
            continue
        key, sep, value = item.partition("=")
        if sep:
            options[key] = value
        else:
            options["cputype"] = item
    return options
