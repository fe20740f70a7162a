# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Desired versus current configuration of a fleet VM: pure functions, no I/O.

Identity: a node's ``address`` (IPv4 with prefix) is given once; it drives ``ipconfig0`` and the VMID
(``vmid = vmid_base + last octet``, ``vmid_base`` 1000 by default, so 10.77.0.105/24 becomes VMID 1105).
Comparison: values are compared as PVE means them, not as strings: ``sshkeys`` as sets of decoded keys,
a missing ``cpu`` as ``kvm64`` (the backend default), ``ipconfig0`` as a set of ``key=value`` pairs.
"""

from __future__ import annotations

import ipaddress
from collections import namedtuple
from urllib.parse import quote, unquote

from ansible_collections.llmgw.fleet.plugins.module_utils import vm_fields
from ansible_collections.llmgw.fleet.plugins.module_utils.ggml_cpu_variants import PVE_CPU_MODEL_VARIANT, SLOW_VARIANTS

DEFAULT_VMID_BASE = vm_fields.default("vmid_base")
MIN_VMID = 100  # pve_verify_vmid: ^[1-9][0-9]{2,8}$
MAX_VMID = 999999999
PVE_DEFAULT_CPU = "kvm64"
DEFAULT_CLOUDINIT_SLOT = "ide2"

# What llama.cpp's CPU backend loader picks under each slow model: it scores every libggml-cpu-*.so and a
# variant scores 0 when a feature it was built for is missing (ggml-backend-reg.cpp, cpu-feats.cpp).
# The CPU models whose guests load a slow variant: one table of models (ggml_cpu_variants), not two.
SLOW_CPU_VARIANTS = {model: variant for model, variant in PVE_CPU_MODEL_VARIANT.items() if variant in SLOW_VARIANTS}
# Measured on one VM, same weights and threads, the only change being cpu: host (the project's seed).
SLOW_GENERATION_FACTOR = "6.7x"
SLOW_PROMPT_FACTOR = "18.9x"

CLOUDINIT_KEYS = ("ciuser", "sshkeys", "ipconfig0", "nameserver", "searchdomain")
# Keys PVE applies to a running VM at once. Every other managed key waits for the next boot: cpu, cores,
# memory, agent and a new drive stay in the config's pending section; the cloud-init keys (and name, the
# guest's hostname) are saved at once but reach the guest only when the drive is regenerated at the next start.
HOT_KEYS = frozenset(["onboot"])
CLOUDINIT_DRIVE_KEY = "cloudinit_drive"
DRIVE_SLOTS = tuple(
    ["ide%d" % i for i in range(4)] + ["sata%d" % i for i in range(6)] + ["scsi%d" % i for i in range(31)]
)


class PlanError(ValueError):
    """The desired state is invalid or contradicts itself; nothing was asked of the API."""


Change = namedtuple("Change", ["key", "before", "after", "needs_reboot"])


# ---------------------------------------------------------------------------------------------- identity


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


# -------------------------------------------------------------------------------------------------- cpu


def cpu_model(cpu):
    """The model of a ``cpu`` config value (``cputype=host,flags=+aes`` -> ``host``); None -> ``kvm64``."""
    if cpu is None or str(cpu).strip() == "":
        return PVE_DEFAULT_CPU
    first = str(cpu).split(",", 1)[0].strip()
    if first.startswith("cputype="):
        first = first[len("cputype=") :]
    return first or PVE_DEFAULT_CPU


def normalize_cpu(cpu):
    """Comparable form of a ``cpu`` value: explicit model first, options sorted."""
    if cpu is None or str(cpu).strip() == "":
        return PVE_DEFAULT_CPU
    parts = [p.strip() for p in str(cpu).split(",") if p.strip()]
    options = sorted(p for p in parts[1:])
    return ",".join([cpu_model(cpu)] + options)


def slow_cpu_variant(cpu):
    """The llama.cpp CPU variant a slow model leaves, or None when the model is not one of the slow ones."""
    return SLOW_CPU_VARIANTS.get(cpu_model(cpu))


def slow_cpu_warning(cpu):
    """The warning for a slow CPU model (None when the model is fine)."""
    variant = slow_cpu_variant(cpu)
    if variant is None:
        return None
    return (
        "cpu %s hides AVX2/FMA from the guest: llama.cpp will load libggml-cpu-%s.so instead of the variant "
        "built for the host's instruction set. Measured on the same weights and threads against cpu host: "
        "%s slower generation, %s slower prompt processing. Use cpu: host unless the VM must live-migrate "
        "between different CPUs." % (cpu_model(cpu), variant, SLOW_GENERATION_FACTOR, SLOW_PROMPT_FACTOR)
    )


def check_cpu(cpu, allow_slow_cpu=False):
    """Refuse a slow CPU model unless explicitly allowed; return the warning to carry when allowed."""
    warning = slow_cpu_warning(cpu)
    if warning is None:
        return None
    if not allow_slow_cpu:
        raise PlanError(
            "refusing cpu %s for an inference node: %s Set allow_slow_cpu: true to accept this."
            % (cpu_model(cpu), warning)
        )
    return warning


# ---------------------------------------------------------------------------------------------- sshkeys


def _key_lines(text):
    for line in str(text or "").splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            yield line


def _key_identity(line):
    """A key is its type and blob; the comment and options do not make it another key."""
    fields = line.split()
    for index, field in enumerate(fields):
        if field.startswith(("ssh-", "ecdsa-", "sk-")) and index + 1 < len(fields):
            return (field, fields[index + 1])
    return (line,)


def normalize_sshkeys(keys):
    """User input (a multi-line string or a list of lines) -> the text to store, one key per line."""
    if keys is None:
        return None
    if isinstance(keys, (list, tuple)):
        keys = "\n".join(str(k) for k in keys)
    lines = list(_key_lines(keys))
    return "\n".join(lines) + "\n" if lines else ""


def decode_sshkeys(value):
    """The ``sshkeys`` value as PVE stores it (URL-encoded) -> the decoded text."""
    return unquote(str(value or ""))


def encode_sshkeys(text):
    """Text -> the URL-encoded form PVE requires (``+`` for space is refused, hence ``safe=''``)."""
    return quote(text, safe="")


def sshkey_set(text):
    """The set of keys (type, blob) in decoded text."""
    return frozenset(_key_identity(line) for line in _key_lines(text))


# ----------------------------------------------------------------------------------------------- drives


def cloudinit_drive(config):
    """The slot holding a cloud-init drive (``ide2``), or None."""
    for slot in DRIVE_SLOTS:
        value = (config or {}).get(slot)
        if value and "cloudinit" in str(value).split(",", 1)[0]:
            return slot
    return None


# ------------------------------------------------------------------------------------------------ plan


class DesiredVM:
    """What the task asks for. ``None`` in a field means: not managed, leave as it is.

    Its fields are the table's DESIRED fields (vm_fields): ``name`` and ``vmid`` required, the rest ``None``
    unless given. ``sshkeys``, ``nameserver`` and ``searchdomain`` are normalized on construction.
    """

    def __post_init__(self):
        self.sshkeys = normalize_sshkeys(self.sshkeys)
        self.nameserver = _join_words(self.nameserver)
        self.searchdomain = _join_words(self.searchdomain)

    def as_dict(self):
        return dict((field, getattr(self, field)) for field in self.FIELDS)


DesiredVM = vm_fields.record_class(DesiredVM, vm_fields.DESIRED, defaults=False)


def _join_words(value):
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        return " ".join(str(v).strip() for v in value if str(v).strip())
    return " ".join(str(value).split())


def memory_mib(value):
    if value is None:
        return None
    text = str(value)
    for part in text.split(","):
        key, sep, val = part.partition("=")
        if not sep:
            return int(key)
        if key == "current":
            return int(val)
    raise ValueError("memory value %r has no size" % text)


def agent_enabled(value):
    """PVE's ``agent`` property string (``1``, ``enabled=yes,fstrim_cloned_disks=1``...) says the guest agent is on.
    ``enabled`` is its default key and a PVE boolean (1/yes/on/true), as qemu-server's agent format declares it; the
    one reading of it for pve_vm's plan and wait_for_node."""
    if value is None:
        return False
    for part in str(value).split(","):
        key, sep, val = part.partition("=")
        flag = val if sep and key == "enabled" else (key if not sep else None)
        if flag is not None:
            return flag.strip() in ("1", "yes", "on", "true")
    return False


def _flag(value):
    return str(value if value is not None else 0).strip() in ("1", "yes", "on", "true")


def _words(value):
    return tuple(str(value or "").split())


def _identity(value):
    return None if value is None else str(value)


def _optional_int(value):
    return None if value is None else int(value)


def _optional_words(value):
    return None if value is None else _words(value)


# key -> (comparable form of a config value (None when absent), comparable form of a desired value)
_COMPARATORS = {
    "name": (_identity, _identity),
    "cpu": (normalize_cpu, normalize_cpu),
    "cores": (_optional_int, int),
    "memory": (memory_mib, int),
    "agent": (agent_enabled, bool),
    "onboot": (_flag, bool),
    "ciuser": (_identity, _identity),
    "sshkeys": (lambda v: sshkey_set(decode_sshkeys(v)), sshkey_set),
    "ipconfig0": (lambda v: None if v is None else parse_ipconfig(v), parse_ipconfig),
    "nameserver": (_optional_words, _words),
    "searchdomain": (_optional_words, _words),
}
MANAGED_KEYS = tuple(_COMPARATORS)


def _send_value(key, desired_value):
    if key == "sshkeys":
        return encode_sshkeys(desired_value)
    if key in ("agent", "onboot"):
        return 1 if desired_value else 0
    return desired_value


def _shown(key, value, from_config):
    """How a value appears in the diff: decoded keys, the effective cpu, booleans, integers."""
    if key == "cpu":
        return normalize_cpu(value)
    if key == "agent":
        return agent_enabled(value) if from_config else bool(value)
    if key == "onboot":
        return _flag(value) if from_config else bool(value)
    if value is None:
        return None
    if key == "sshkeys":
        return normalize_sshkeys(decode_sshkeys(value) if from_config else value)
    if key == "memory":
        return memory_mib(value)
    if key == "cores":
        return int(value)
    if key in ("nameserver", "searchdomain"):
        return " ".join(_words(value))
    return value


class ConfigPlan:
    """The changes that turn a current config into the desired one."""

    def __init__(self, changes, params, digest=None):
        self.changes = changes  # list of Change
        self.params = params  # what to send in one config update (besides digest)
        self.digest = digest

    @property
    def empty(self):
        return not self.changes

    @property
    def reboot_keys(self):
        return [c.key for c in self.changes if c.needs_reboot]


def plan_config(desired, current, running=False):
    """Compare ``desired`` (DesiredVM) with ``current`` (a config dict as GET config returns it).

    ``running`` says whether the VM runs now: then every change outside HOT_KEYS takes effect only at the
    next boot and is marked ``needs_reboot``. Raises PlanError when the config cannot take the change.
    """
    current = current or {}
    changes = []
    params = {}
    for key in MANAGED_KEYS:
        wanted = getattr(desired, key)
        if wanted is None:
            continue
        have_raw = current.get(key)
        config_form, desired_form = _COMPARATORS[key]
        try:
            have = config_form(have_raw)
        except ValueError as exc:
            raise PlanError("cannot read %s=%r from the VM's config: %s" % (key, have_raw, exc))
        try:
            want = desired_form(wanted)
        except ValueError as exc:
            raise PlanError("%s=%r is not valid: %s" % (key, wanted, exc))
        if have == want:
            continue
        changes.append(
            Change(key, _shown(key, have_raw, True), _shown(key, wanted, False), bool(running) and key not in HOT_KEYS)
        )
        params[key] = _send_value(key, wanted)

    if desired.cloudinit_storage is not None or any(getattr(desired, k) is not None for k in CLOUDINIT_KEYS):
        slot = cloudinit_drive(current)
        if slot is None:
            if current.get(DEFAULT_CLOUDINIT_SLOT):
                raise PlanError(
                    "the VM has no cloud-init drive and %s, where one would go, holds %r; free %s or add a "
                    "cloud-init drive yourself"
                    % (DEFAULT_CLOUDINIT_SLOT, current[DEFAULT_CLOUDINIT_SLOT], DEFAULT_CLOUDINIT_SLOT)
                )
            # A DesiredVM built without cloudinit_storage gets the drive where the module puts it by default.
            storage = desired.cloudinit_storage or vm_fields.default("cloudinit_storage")
            value = "%s:cloudinit" % storage
            changes.append(Change(CLOUDINIT_DRIVE_KEY, None, "%s=%s" % (DEFAULT_CLOUDINIT_SLOT, value), bool(running)))
            params[DEFAULT_CLOUDINIT_SLOT] = value
    return ConfigPlan(changes, params, digest=current.get("digest"))


def reboot_warning(name, vmid, keys):
    return (
        "VM %s (%s) runs with configuration changes that take effect only at its next boot: %s. Reboot it "
        "(or set reboot_if_needed: true) for them to apply." % (name, vmid, ", ".join(sorted(set(keys))))
    )


# --------------------------------------------------------------------------------------- difference tracker


class DifferenceTracker:
    """Records every difference this run found or made; ``changed`` and the diff both come from it."""

    def __init__(self):
        self._items = []

    def add(self, name, before=None, after=None):
        self._items.append((name, before, after))

    @property
    def empty(self):
        return not self._items

    def names(self):
        return [item[0] for item in self._items]

    def has(self, name):
        return any(item[0] == name for item in self._items)

    def before_after(self):
        before = {}
        after = {}
        for name, old, new in self._items:
            before[name] = old
            after[name] = new
        return before, after
