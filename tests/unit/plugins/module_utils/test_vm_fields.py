"""The VM fields are stated once (module_utils/vm_fields.py): pve_vm's DOCUMENTATION, its argument spec, VMRequest
and DesiredVM all agree with the table, so they cannot drift apart again."""

import inspect

import yaml
from ansible.module_utils.basic import env_fallback

from ansible_collections.llmgw.fleet.plugins.module_utils import vm_fields
from ansible_collections.llmgw.fleet.plugins.module_utils._proxmox_args import proxmox_argument_spec
from ansible_collections.llmgw.fleet.plugins.module_utils.proxmox_client import ENV_FALLBACKS
from ansible_collections.llmgw.fleet.plugins.module_utils.pve_vm_runner import STATES, VMRequest
from ansible_collections.llmgw.fleet.plugins.module_utils.vm_plan import (
    CLOUDINIT_KEYS,
    DEFAULT_VMID_BASE,
    MANAGED_KEYS,
    DesiredVM,
    plan_config,
)
from ansible_collections.llmgw.fleet.plugins.modules import pve_vm

DOC_KEYS = ("type", "elements", "choices", "default", "required")


def documented_options():
    return yaml.safe_load(pve_vm.DOCUMENTATION)["options"]


def table_as_documented(field):
    """What DOCUMENTATION says of a field, from the table (no_log is not a documentation key)."""
    entry = {"type": field.type}
    for key in ("elements", "choices", "default"):
        value = getattr(field, key)
        if value is not None:
            entry[key] = list(value) if key == "choices" else value
    if field.required:
        entry["required"] = True
    return entry


def test_documentation_options_are_the_table():
    options = documented_options()
    assert list(options) == [f.name for f in vm_fields.OPTIONS]
    for field in vm_fields.OPTIONS:
        documented = dict((k, v) for k, v in options[field.name].items() if k in DOC_KEYS)
        assert documented == table_as_documented(field), field.name


def test_environment_fallbacks_are_documented_and_the_clients():
    options = documented_options()
    for field in vm_fields.OPTIONS:
        if field.env is not None:
            assert field.env == ENV_FALLBACKS[field.name]
            assert "E(%s)" % field.env in " ".join(options[field.name]["description"])


def test_module_argument_spec_is_the_connection_spec_plus_the_table():
    spec = pve_vm.argument_spec()
    connection = proxmox_argument_spec()
    assert set(spec) == set(connection) | set(f.name for f in vm_fields.OPTIONS)
    assert not set(connection) & set(vm_fields.BY_NAME)
    assert set(connection) == pve_vm.CONNECTION_KEYS
    for field in vm_fields.OPTIONS:
        entry = dict(spec[field.name])
        expected = {"type": field.type}
        if field.required:
            expected["required"] = True
        for key in ("default", "elements", "no_log"):
            if getattr(field, key) is not None:
                expected[key] = getattr(field, key)
        if field.choices is not None:
            expected["choices"] = list(field.choices)
        if field.env is not None:
            expected["fallback"] = (env_fallback, [field.env])
        assert entry == expected, field.name


def test_sshkeys_are_declared_not_secret():
    assert pve_vm.argument_spec()["sshkeys"]["no_log"] is False


def test_vm_request_takes_every_option_with_the_documented_default():
    params = inspect.signature(VMRequest).parameters
    assert list(params) == [f.name for f in vm_fields.OPTIONS]
    request = VMRequest(name="node05")
    for field in vm_fields.OPTIONS:
        if not field.required:
            assert params[field.name].default == field.default, field.name
            assert getattr(request, field.name) == field.default, field.name
    assert request.cloudinit_storage == "local-lvm"
    assert STATES == ("present", "started", "stopped", "absent")
    assert DEFAULT_VMID_BASE == vm_fields.default("vmid_base") == 1000


def test_desired_vm_fields_are_the_tables_and_default_to_unmanaged():
    params = inspect.signature(DesiredVM).parameters
    assert list(params) == [f.name for f in vm_fields.DESIRED] == list(DesiredVM.FIELDS)
    assert DesiredVM.FIELDS == (
        "name", "vmid", "cpu", "cores", "memory", "agent", "onboot", "ciuser", "sshkeys", "ipconfig0", "nameserver",
        "searchdomain", "cloudinit_storage",
    )
    desired = DesiredVM("node05", 1105)
    assert desired.as_dict() == dict(dict.fromkeys(DesiredVM.FIELDS), name="node05", vmid=1105)
    assert set(MANAGED_KEYS) <= set(DesiredVM.FIELDS) and set(CLOUDINIT_KEYS) <= set(DesiredVM.FIELDS)


def test_desired_vm_normalizes_keys_and_words():
    key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIE4pI0qvGKY5Ca7z0kk8r3Tqb7FEAPOWcUpCIkHNO2yl fleet@controller"
    desired = DesiredVM(name="n", vmid=101, sshkeys=[key], nameserver=["10.0.0.1", "10.0.0.2"], searchdomain=" a  b ")
    assert desired.sshkeys == key + "\n"
    assert desired.nameserver == "10.0.0.1 10.0.0.2" and desired.searchdomain == "a b"


def test_cloudinit_drive_storage_defaults_to_the_documented_default():
    plan = plan_config(DesiredVM(name="n", vmid=101, ciuser="debian"), {"name": "n"})
    assert plan.params["ide2"] == "%s:cloudinit" % vm_fields.default("cloudinit_storage")
