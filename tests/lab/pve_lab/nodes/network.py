"""The lab network: bridge llmgwbr0 in the root namespace, a namespace + veth per container, a tap per guest.

Nodes get a default route to 10.77.0.1, which no one holds, and the host never forwards (ip_forward stays 0),
so a node reaches the bridge address and its peers and nothing else.
"""

from __future__ import annotations

import ipaddress
import json
import os
from typing import Dict, List, Optional

from pve_lab.nodes.common import (
    BRIDGE,
    BRIDGE_ADDRESS,
    LINK_PREFIX,
    NETNS_PREFIX,
    NETWORK,
    NETWORK_PREFIXLEN,
    LabError,
    netns_name,
    run,
    tap_name,
    veth_name,
)


def ip_forward_enabled() -> bool:
    with open("/proc/sys/net/ipv4/ip_forward") as handle:
        return handle.read().strip() != "0"


def link_exists(name: str, netns: Optional[str] = None) -> bool:
    argv = ["ip"] + (["-n", netns] if netns else []) + ["link", "show", "dev", name]
    return run(argv, check=False).returncode == 0


def ensure_bridge() -> None:
    if ip_forward_enabled():
        raise LabError("net.ipv4.ip_forward is 1 on this host: the lab's nodes must have no way out, "
                       "so it refuses to start (set it to 0)")
    if not link_exists(BRIDGE):
        run(["ip", "link", "add", BRIDGE, "type", "bridge", "stp_state", "0", "forward_delay", "0"])
    addresses = json.loads(run(["ip", "-j", "addr", "show", "dev", BRIDGE]).stdout)
    have = {(a["local"], a["prefixlen"]) for entry in addresses for a in entry.get("addr_info", [])}
    if (BRIDGE_ADDRESS, NETWORK_PREFIXLEN) not in have:
        run(["ip", "addr", "add", "%s/%d" % (BRIDGE_ADDRESS, NETWORK_PREFIXLEN), "dev", BRIDGE])
    run(["ip", "link", "set", BRIDGE, "up"])


def check_address(ipconfig: Dict[str, str]) -> Optional[ipaddress.IPv4Interface]:
    """The static IPv4 address of an ipconfig, refused when it lies outside the lab network."""
    ip = ipconfig.get("ip")
    if not ip or ip == "dhcp":
        return None
    iface = ipaddress.IPv4Interface(ip)
    if iface.ip not in ipaddress.IPv4Network(NETWORK) or str(iface.ip) == BRIDGE_ADDRESS:
        raise LabError("address %s is not one the lab can give a node (network %s, %s is the host)"
                       % (ip, NETWORK, BRIDGE_ADDRESS))
    return iface


def setup_container_netns(vmid: int, mac: str, ipconfig: Dict[str, str]) -> str:
    """A fresh namespace whose eth0 is a veth on the bridge, addressed from the host (`ip -n`)."""
    ns = netns_name(vmid)
    remove_container_netns(vmid)
    run(["ip", "netns", "add", ns])
    run(["ip", "link", "add", veth_name(vmid), "type", "veth", "peer", "name", "eth0", "netns", ns])
    run(["ip", "-n", ns, "link", "set", "eth0", "address", mac])
    run(["ip", "link", "set", veth_name(vmid), "master", BRIDGE, "up"])
    run(["ip", "-n", ns, "link", "set", "lo", "up"])
    run(["ip", "-n", ns, "link", "set", "eth0", "up"])
    iface = check_address(ipconfig)
    if iface is not None:
        run(["ip", "-n", ns, "addr", "add", str(iface), "dev", "eth0"])
        if ipconfig.get("gw"):
            run(["ip", "-n", ns, "route", "add", "default", "via", ipconfig["gw"], "dev", "eth0"])
    return ns


def remove_container_netns(vmid: int) -> None:
    if link_exists(veth_name(vmid)):
        run(["ip", "link", "del", veth_name(vmid)], check=False)
    if os.path.exists("/run/netns/" + netns_name(vmid)):
        run(["ip", "netns", "del", netns_name(vmid)], check=False)


def setup_tap(vmid: int) -> str:
    tap = tap_name(vmid)
    remove_tap(vmid)
    run(["ip", "tuntap", "add", "dev", tap, "mode", "tap"])
    run(["ip", "link", "set", tap, "master", BRIDGE, "up"])
    return tap


def remove_tap(vmid: int) -> None:
    if link_exists(tap_name(vmid)):
        run(["ip", "link", "del", tap_name(vmid)], check=False)


def lab_netns() -> List[str]:
    names = []
    for line in run(["ip", "netns", "list"], check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        if name.startswith(NETNS_PREFIX):
            names.append(name)
    return names


def lab_links() -> List[str]:
    links = json.loads(run(["ip", "-j", "link", "show"]).stdout or "[]")
    return [link["ifname"] for link in links if link.get("ifname", "").startswith(LINK_PREFIX)]


def teardown() -> None:
    """Remove every lab namespace and interface, the bridge last."""
    for ns in lab_netns():
        run(["ip", "netns", "del", ns], check=False)
    for name in sorted(lab_links(), key=lambda n: n == BRIDGE):
        run(["ip", "link", "del", name], check=False)


def partition(vmid: int, heal: bool = False) -> str:
    """Cut a running node off the bridge (its link down on the host side) or heal it: the node keeps running, its
    processes and units with it, and nothing reaches it meanwhile -- a network partition, which Proxmox's API has
    no word for. Returns the link's name."""
    for link in (veth_name(vmid), tap_name(vmid)):
        if link_exists(link):
            run(["ip", "link", "set", link, "up" if heal else "down"])
            return link
    raise LabError("VM %d has no link on the lab bridge: it is not running as a lab node" % vmid)
