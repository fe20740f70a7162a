# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A node's identity: its ``address`` (IPv4 with prefix) checked, the VMID derived from it (``vmid = vmid_base +
last octet``), ``ipconfig0`` written and read; and :class:`PlanError`, the error of every VM plan rule.

Private to :mod:`vm_plan` (which re-exports the public names); pure: no I/O.
"""

from __future__ import annotations

import ipaddress

from ansible_collections.llmgw.fleet.plugins.module_utils import vm_fields

DEFAULT_VMID_BASE = vm_fields.default("vmid_base")
MIN_VMID = 100  # pve_verify_vmid: ^[1-9][0-9]{2,8}$
MAX_VMID = 999999999


class PlanError(ValueError):
    """The desired state is invalid or contradicts itself; nothing was asked of the API."""


def parse_address(address):
    """``10.77.0.105/24`` -> IPv4Interface. The prefix is required and the address must be a host address."""
    if not isinstance(address, str) or "/" not in address:
        raise PlanError("address %r must be an IPv4 address with its prefix length, e.g. 10.77.0.105/24" % (address,))
    try:
        interface = ipaddress.IPv4Interface(address.strip())
    except (ipaddress.AddressValueError, ipaddress.NetmaskValueError, ValueError) as exc:
        raise PlanError("address %r is not an IPv4 address with prefix: %s" % (address, exc))
    network = interface.network
    if network.prefixlen <= 30 and interface.ip in (network.network_address, network.broadcast_address):
        raise PlanError(
            "address %s is the %s address of %s, not a host address"
            % (
                address,
                "network" if interface.ip == network.network_address else "broadcast",
                network,
            )
        )
    return interface


def derive_vmid(address=None, vmid_base=DEFAULT_VMID_BASE, vmid=None):
    """The VMID for a node: an explicit ``vmid`` wins, else ``vmid_base + last octet of address``."""
    if vmid is not None:
        vmid = _as_int(vmid, "vmid")
        _check_vmid(vmid, "vmid %d" % vmid)
        return vmid
    if address is None:
        raise PlanError("either address or vmid is needed to know the VMID")
    base = _as_int(vmid_base, "vmid_base")
    if base < 0:
        raise PlanError("vmid_base %d is negative" % base)
    octet = int(str(parse_address(address).ip).rsplit(".", 1)[1])
    derived = base + octet
    _check_vmid(derived, "vmid_base %d + last octet %d of %s = %d" % (base, octet, address, derived))
    return derived


def _check_vmid(vmid, how):
    if vmid < MIN_VMID:
        raise PlanError(
            "%s is below %d, which Proxmox refuses as a VM ID; raise vmid_base or pass vmid" % (how, MIN_VMID)
        )
    if vmid > MAX_VMID:
        raise PlanError("%s is above %d, the largest VM ID Proxmox accepts" % (how, MAX_VMID))


def _as_int(value, what):
    try:
        return int(value)
    except (TypeError, ValueError):
        raise PlanError("%s %r is not an integer" % (what, value))


def vmid_block(vmid_base):
    """The VMIDs the derivation can produce for a base: one per last octet, 0..255."""
    return int(vmid_base), int(vmid_base) + 255


def next_id_clash(vmid, next_free_id, vmid_base=None):
    """A warning when VMs created elsewhere without an explicit id (GUI, scripts) would take the fleet's ids.

    PVE hands out the lowest free id of its ``next-id`` range. When that id already lies inside the fleet's
    VMID block (or equals an explicit vmid), the next VM anybody creates takes an id the fleet derives.
    """
    if next_free_id is None:
        return None
    next_free_id = int(next_free_id)
    if vmid_base is not None:
        low, high = vmid_block(vmid_base)
        if low <= next_free_id <= high:
            return (
                "the cluster's next free VMID is %d, inside this fleet's block %d-%d (vmid_base %d): VMs "
                "created without an explicit id take the fleet's VMIDs, and a fleet node whose VMID is taken "
                "is refused. Move the datacenter's next-id range (Datacenter > Options > Next Free VMID Range) "
                "below %d or above %d, or choose another vmid_base." % (next_free_id, low, high, vmid_base, low, high)
            )
        return None
    if next_free_id == vmid:
        return (
            "VMID %d is the cluster's next free id: a VM created elsewhere without an explicit id would take it" % vmid
        )
    return None


def ipconfig0_for(address, gateway=None):
    """The ``ipconfig0`` value for an address (and optional gateway, which must be inside its network)."""
    interface = parse_address(address)
    value = "ip=%s" % interface.with_prefixlen
    if gateway:
        try:
            gw = ipaddress.IPv4Address(str(gateway).strip())
        except ValueError as exc:
            raise PlanError("gateway %r is not an IPv4 address: %s" % (gateway, exc))
        if gw not in interface.network:
            raise PlanError("gateway %s is not inside %s (the network of %s)" % (gw, interface.network, address))
        if gw == interface.ip:
            raise PlanError("gateway %s is the node's own address" % gw)
        value += ",gw=%s" % gw
    return value


def parse_ipconfig(value):
    """``ip=10.77.0.105/24,gw=10.77.0.1`` -> {"ip": ..., "gw": ...}."""
    result = {}
    for part in str(value or "").split(","):
        part = part.strip()
        if not part:
            continue
        key, sep, val = part.partition("=")
        result[key.strip()] = val.strip() if sep else ""
    return result


def address_of(config):
    """The static IPv4 ``ip`` of ``ipconfig0`` (``10.77.0.105/24``), or None (dhcp, absent)."""
    ip = parse_ipconfig((config or {}).get("ipconfig0")).get("ip")
    if not ip or ip in ("dhcp", "manual"):
        return None
    return ip


def same_host_ip(left, right):
    """Whether two ``ip[/prefix]`` values name the same IPv4 address."""
    try:
        return ipaddress.IPv4Interface(left).ip == ipaddress.IPv4Interface(right).ip
    except (ValueError, TypeError):
        return False
