"""The NoCloud seed Proxmox VE writes for a VM, from its config.

Mirrors qemu-server's PVE/QemuServer/Cloudinit.pm (cloudinit_userdata, nocloud_network, nocloud_metadata) so
that cloud-init in a node sees what it would see on a PVE guest. One addition: ``locale: C.UTF-8``, because
cloud-init 22.4's cc_locale fails on a minbase root without it (a PVE cloud image ships the locales package).
The lab has no DNS for its nodes, so where PVE would fall back to the host's resolv.conf the lab has nothing.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import tempfile
from typing import Dict, Optional

from pve_lab.nodes.common import default_mac, run, write_file
from pve_lab.nodes.spec import VMSpec

SEED_FILES = ("user-data", "meta-data", "network-config", "vendor-data")


def parse_ipconfig(ipconfig: Optional[str]) -> Dict[str, str]:
    """`ip=10.77.0.105/24,gw=10.77.0.1` as a dict (keys ip, gw, ip6, gw6)."""
    result: Dict[str, str] = {}
    for item in (ipconfig or "").split(","):
        key, sep, value = item.strip().partition("=")
        if sep and key in ("ip", "gw", "ip6", "gw6"):
            result[key] = value
    return result


def mac_of(spec: VMSpec) -> str:
    return (spec.macaddr or default_mac(spec.vmid)).lower()


def hostname_fqdn(spec: VMSpec):
    hostname = spec.name or "VM%d" % spec.vmid
    if "." in hostname:
        return hostname.split(".", 1)[0], hostname
    if spec.searchdomain:
        return hostname, "%s.%s" % (hostname, spec.searchdomain)
    return hostname, hostname


def user_data(spec: VMSpec) -> str:
    hostname, fqdn = hostname_fqdn(spec)
    lines = ["#cloud-config", "hostname: %s" % hostname, "manage_etc_hosts: true", "fqdn: %s" % fqdn]
    if spec.ciuser is not None:
        lines.append("user: %s" % spec.ciuser)
        if spec.ciuser == "root":
            lines.append("disable_root: False")
    if spec.sshkeys is not None:
        keys = [key.strip() for key in spec.sshkeys.split("\n") if key.strip()]
        lines.append("ssh_authorized_keys:")
        lines.extend("  - %s" % key for key in keys)
    lines += ["chpasswd:", "  expire: False"]
    if spec.ciuser != "root":
        lines += ["users:", "  - default"]
    if spec.ciupgrade is None or spec.ciupgrade:
        lines.append("package_upgrade: true")
    lines.append("locale: C.UTF-8")  # lab addition, see the module docstring
    return "\n".join(lines) + "\n"


def network_config(spec: VMSpec) -> str:
    content = "version: 1\nconfig:\n"
    net = parse_ipconfig(spec.ipconfig0)
    if net:
        content += "    - type: physical\n      name: eth0\n      mac_address: '%s'\n      subnets:\n" % mac_of(spec)
        ip = net.get("ip")
        if ip == "dhcp":
            content += "      - type: dhcp4\n"
        elif ip:
            iface = ipaddress.ip_interface(ip)
            content += "      - type: static\n        address: '%s'\n        netmask: '%s'\n" % (
                iface.ip, iface.network.netmask)
            if net.get("gw"):
                content += "        gateway: '%s'\n" % net["gw"]
        ip6 = net.get("ip6")
        if ip6 == "dhcp":
            content += "      - type: dhcp6\n"
        elif ip6 == "auto":
            content += "      - type: ipv6_slaac\n"
        elif ip6:
            content += "      - type: static6\n        address: '%s'\n" % ip6
            if net.get("gw6"):
                content += "        gateway: '%s'\n" % net["gw6"]
    nameservers = (spec.nameserver or "").split()
    searchdomains = (spec.searchdomain or "").split()
    if not nameservers and not searchdomains:
        return content  # PVE would list the host's resolvers here; an empty entry fails cloud-init's schema
    content += "    - type: nameserver\n"
    if nameservers:
        content += "      address:\n" + "".join("      - '%s'\n" % ns for ns in nameservers)
    if searchdomains:
        content += "      search:\n" + "".join("      - '%s'\n" % sd for sd in searchdomains)
    return content


def meta_data(spec: VMSpec) -> str:
    return "instance-id: %s\n" % spec.instance_id


def seed_files(spec: VMSpec) -> Dict[str, str]:
    return {
        "user-data": user_data(spec),
        "meta-data": meta_data(spec),
        "network-config": network_config(spec),
        "vendor-data": "",
    }


def write_seed_dir(spec: VMSpec, directory: str) -> None:
    """The seed as files, for a container (NoCloud reads /var/lib/cloud/seed/nocloud/)."""
    for name, content in seed_files(spec).items():
        write_file(os.path.join(directory, name), content, mode=0o600)


def write_seed_iso(spec: VMSpec, iso_path: str) -> None:
    """The seed as PVE attaches it: an ISO 9660 volume labelled cidata (`genisoimage -R -V cidata`)."""
    staging = tempfile.mkdtemp(prefix="llmgw-seed-")
    try:
        write_seed_dir(spec, staging)
        run(["genisoimage", "-quiet", "-R", "-V", "cidata", "-o", iso_path + ".tmp", staging])
        os.replace(iso_path + ".tmp", iso_path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
