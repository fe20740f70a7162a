# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fields of a fleet VM, stated once: pure data, no I/O.

``llmgw.fleet.pve_vm``'s argument spec (its VM options; the connection options come from ``_proxmox_args``),
the runner's ``VMRequest`` and the plan's ``DesiredVM`` are all built from ``FIELDS``. Each field says its
Ansible type (with elements, choices, no_log), the default the module documents and applies, the check its
value must pass before the module connects (``_vm_option_checks``), and where it belongs:

- ``option``: a module option, hence a ``VMRequest`` attribute (``ipconfig0`` is not: it is derived from
  ``address`` and ``gateway``).
- ``desired``: part of the desired VM config, a ``DesiredVM`` attribute: ``REQUIRED`` (``name``, ``vmid``,
  the resolved VMID) or ``MANAGED`` (``None`` means not managed, leave as it is, so a ``DesiredVM`` field
  defaults to ``None`` whatever the option's default). Fields with ``desired=None`` are request, identity or
  behaviour options only (state, address, clone, timeouts...).

tests/unit/plugins/module_utils/test_vm_fields.py checks pve_vm's DOCUMENTATION against this table.
"""

from __future__ import annotations

import dataclasses
from collections import namedtuple

from ansible_collections.llmgw.fleet.plugins.module_utils import _vm_option_checks as checks

REQUIRED = "required"
MANAGED = "managed"

VMField = namedtuple(
    "VMField",
    ["name", "type", "default", "required", "choices", "elements", "no_log", "env", "option", "desired", "check"],
)


def _field(name, type, default=None, required=False, choices=None, elements=None, no_log=None, env=None,
           option=True, desired=None, check=None):
    return VMField(name, type, default, required, choices, elements, no_log, env, option, desired, check)


# In the order of pve_vm's DOCUMENTATION; DesiredVM's positional order is this order too.
FIELDS = (
    _field("name", "str", required=True, desired=REQUIRED, check=checks.dns_name),
    _field("state", "str", default="present", choices=("present", "started", "stopped", "absent")),
    _field("address", "str"),
    _field("gateway", "str"),
    # The option is the explicit VMID (None: derived); DesiredVM's vmid is the VMID resolved from either.
    _field("vmid", "int", desired=REQUIRED),
    _field("vmid_base", "int", default=1000),
    _field("node", "str", env="PROXMOX_NODE", check=checks.node_name),
    _field("clone", "str", check=checks.not_empty),
    _field("full_clone", "bool", default=True),
    _field("storage", "str", check=checks.storage_id),
    _field("pool", "str", check=checks.pool_id),
    _field("cpu", "str", default="host", desired=MANAGED),
    _field("allow_slow_cpu", "bool", default=False),
    _field("cores", "int", desired=MANAGED, check=checks.at_least(1, "cores per socket Proxmox VE accepts", 4)),
    _field("memory", "int", desired=MANAGED, check=checks.at_least(16, "MiB of memory Proxmox VE accepts", 4096)),
    _field("agent", "bool", desired=MANAGED),
    _field("onboot", "bool", desired=MANAGED),
    _field("ciuser", "str", desired=MANAGED, check=checks.user_name),
    # Public keys, not secrets: no_log=False says so to Ansible (the name contains "keys").
    _field("sshkeys", "raw", no_log=False, desired=MANAGED, check=checks.public_keys),
    _field("ipconfig0", "str", option=False, desired=MANAGED),
    _field("nameserver", "raw", desired=MANAGED, check=checks.addresses),
    _field("searchdomain", "raw", desired=MANAGED, check=checks.domains),
    _field("cloudinit_storage", "str", default="local-lvm", desired=MANAGED, check=checks.storage_id),
    _field("bridge", "str", default="vmbr0", check=checks.bridge_id),
    _field("reboot_if_needed", "bool", default=False),
    _field("timeout", "int", default=600, check=checks.at_least(1, "seconds to wait for a task", 600)),
    _field("shutdown_timeout", "int", default=120, check=checks.at_least(0, "seconds of a shutdown's grace", 120)),
)
BY_NAME = dict((f.name, f) for f in FIELDS)
OPTIONS = tuple(f for f in FIELDS if f.option)
DESIRED = tuple(f for f in FIELDS if f.desired)


def option_problems(request):
    """Each option of ``request`` its field's check refuses (``_vm_option_checks``), as sentences naming the
    option, the value and the fix."""
    return checks.problems(request, OPTIONS)


def default(name):
    """The default the module documents (and applies) for option ``name``."""
    return BY_NAME[name].default


def option_spec(field, env_fallback=None):
    """One option's argument spec entry (with an environment fallback when ``env_fallback`` is given)."""
    spec = {"type": field.type}
    if field.required:
        spec["required"] = True
    if field.default is not None:
        spec["default"] = field.default
    if field.choices is not None:
        spec["choices"] = list(field.choices)
    if field.elements is not None:
        spec["elements"] = field.elements
    if field.no_log is not None:
        spec["no_log"] = field.no_log
    if field.env is not None and env_fallback is not None:
        spec["fallback"] = (env_fallback, [field.env])
    return spec


def argument_spec(env_fallback=None):
    """pve_vm's VM options as an AnsibleModule argument spec; pass ``ansible.module_utils.basic.env_fallback``
    for the environment fallbacks (this module stays free of Ansible imports)."""
    return dict((f.name, option_spec(f, env_fallback)) for f in OPTIONS)


def record_class(cls, fields, defaults=True):
    """Make ``cls`` a dataclass (no generated ``__eq__``: compared by identity, as before) whose fields are
    ``fields``, in their order. With ``defaults`` the option's default applies; without, every field that is
    not ``REQUIRED`` defaults to ``None`` (DesiredVM: not managed). ``cls.FIELDS`` is the tuple of names."""
    annotations = {}
    for f in fields:
        annotations[f.name] = "object"
        if defaults:
            optional = not f.required
            value = f.default
        else:
            optional = f.desired != REQUIRED
            value = None
        if optional:
            setattr(cls, f.name, value)
    cls.__annotations__ = annotations
    cls.FIELDS = tuple(f.name for f in fields)
    return dataclasses.dataclass(eq=False)(cls)
