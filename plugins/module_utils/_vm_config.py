# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The config plan and diff: :class:`DesiredVM` compared with the VM's current config (values as PVE means
them), the changes and the one config update that makes them, which of them wait for a reboot, and
:class:`DifferenceTracker`, from which ``changed`` and the diff come.

Private to :mod:`vm_plan` (which re-exports the public names); pure: no I/O.
"""

from __future__ import annotations

from collections import namedtuple

from ansible_collections.llmgw.fleet.plugins.module_utils import vm_fields
from ansible_collections.llmgw.fleet.plugins.module_utils._vm_address import PlanError, parse_ipconfig
from ansible_collections.llmgw.fleet.plugins.module_utils._vm_cpu import normalize_cpu
from ansible_collections.llmgw.fleet.plugins.module_utils._vm_sshkeys import (
    decode_sshkeys,
    encode_sshkeys,
    normalize_sshkeys,
    sshkey_set,
)

DEFAULT_CLOUDINIT_SLOT = "ide2"
CLOUDINIT_KEYS = ("ciuser", "sshkeys", "ipconfig0", "nameserver", "searchdomain")
# Keys PVE applies to a running VM at once. Every other managed key waits for the next boot: cpu, cores,
# memory, agent and a new drive stay in the config's pending section; the cloud-init keys (and name, the
# guest's hostname) are saved at once but reach the guest only when the drive is regenerated at the next start.
HOT_KEYS = frozenset(["onboot"])
CLOUDINIT_DRIVE_KEY = "cloudinit_drive"
DRIVE_SLOTS = tuple(
    ["ide%d" % i for i in range(4)] + ["sata%d" % i for i in range(6)] + ["scsi%d" % i for i in range(31)]
)

Change = namedtuple("Change", ["key", "before", "after", "needs_reboot"])


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
