"""What the node backend derives from a VM's config: the NoCloud seed PVE would write, and QEMU's -cpu."""

from __future__ import annotations

import dataclasses

import pytest

from pve_lab.nodes import cloudinit
from pve_lab.nodes.common import LabError, default_mac
from pve_lab.nodes.qemu import cpu_argument
from pve_lab.nodes.spec import VMSpec

KEY_A = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIK0000000000000000000000000000000000000000000 a@x"
KEY_B = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIK1111111111111111111111111111111111111111111 b@x"


def spec(**overrides) -> VMSpec:
    base = VMSpec(
        vmid=105, name="node05", cpu=None, cores=2, memory=2048, has_os=True, agent=True, ciuser="ops",
        sshkeys=KEY_A + "\n", ipconfig0="ip=10.77.0.105/24,gw=10.77.0.1", nameserver=None, searchdomain=None,
        instance_id="3f2a",
    )
    return dataclasses.replace(base, **overrides)


def test_user_data_is_what_pve_writes_plus_the_locale():
    assert cloudinit.user_data(spec(sshkeys=KEY_A + "\n\n" + KEY_B)) == (
        "#cloud-config\n"
        "hostname: node05\n"
        "manage_etc_hosts: true\n"
        "fqdn: node05\n"
        "user: ops\n"
        "ssh_authorized_keys:\n"
        "  - %s\n"
        "  - %s\n"
        "chpasswd:\n"
        "  expire: False\n"
        "users:\n"
        "  - default\n"
        "package_upgrade: true\n"
        "locale: C.UTF-8\n" % (KEY_A, KEY_B)
    )


def test_ciupgrade_0_drops_the_package_upgrade():
    assert "package_upgrade" not in cloudinit.user_data(spec(ciupgrade=False))
    assert "package_upgrade: true\n" in cloudinit.user_data(spec(ciupgrade=True))


def test_root_user_keeps_root_login_and_no_default_user():
    data = cloudinit.user_data(spec(ciuser="root"))
    assert "disable_root: False\n" in data
    assert "users:" not in data


def test_fqdn_comes_from_the_searchdomain_or_a_dotted_name():
    assert "fqdn: node05.lab.example\n" in cloudinit.user_data(spec(searchdomain="lab.example"))
    data = cloudinit.user_data(spec(name="node05.fleet.example"))
    assert "hostname: node05\n" in data and "fqdn: node05.fleet.example\n" in data


def test_network_config_is_v1_static_on_net0_mac():
    config = cloudinit.network_config(spec(nameserver="10.77.0.53", searchdomain="lab.example"))
    assert config == (
        "version: 1\n"
        "config:\n"
        "    - type: physical\n"
        "      name: eth0\n"
        "      mac_address: '%s'\n"
        "      subnets:\n"
        "      - type: static\n"
        "        address: '10.77.0.105'\n"
        "        netmask: '255.255.255.0'\n"
        "        gateway: '10.77.0.1'\n"
        "    - type: nameserver\n"
        "      address:\n"
        "      - '10.77.0.53'\n"
        "      search:\n"
        "      - 'lab.example'\n" % default_mac(105)
    )


def test_network_config_without_ipconfig_has_no_interface():
    assert cloudinit.network_config(spec(ipconfig0=None)) == "version: 1\nconfig:\n"


def test_mac_is_the_configured_one_or_a_stable_proxmox_one():
    assert cloudinit.mac_of(spec(macaddr="BC:24:11:AA:BB:CC")) == "bc:24:11:aa:bb:cc"
    assert default_mac(105) == "bc:24:11:00:00:69"
    assert default_mac(70000) != default_mac(70001)


def test_meta_data_carries_the_instance_id():
    assert cloudinit.meta_data(spec(instance_id="abc123")) == "instance-id: abc123\n"


def test_parse_ipconfig():
    assert cloudinit.parse_ipconfig("ip=10.77.0.9/24,gw=10.77.0.1,ip6=auto") == {
        "ip": "10.77.0.9/24", "gw": "10.77.0.1", "ip6": "auto"}
    assert cloudinit.parse_ipconfig(None) == {}


@pytest.mark.parametrize("cpu, expected", [
    (None, "kvm64,+lahf_lm,+sep,enforce"),
    ("kvm64", "kvm64,+lahf_lm,+sep,enforce"),
    ("qemu64", "qemu64,enforce"),
    ("x86-64-v2-AES", "qemu64,+aes,+pni,+popcnt,+sse4.1,+sse4.2,+ssse3,enforce"),
    ("cputype=x86-64-v3,flags=+pdpe1gb;+avx512f", "qemu64,+abm,+aes,+avx,+avx2,+bmi1,+bmi2,+f16c,+fma,+movbe,"
     "+pdpe1gb,+pni,+popcnt,+sse4.1,+sse4.2,+ssse3,+xsave,+xsaveopt,enforce"),
])
def test_cpu_argument_follows_pve_and_never_drops_a_flag_silently(cpu, expected):
    # +avx512f is not a flag a VM config may set (PVE refuses it), so it is not passed on
    assert cpu_argument(cpu) == expected


def test_host_cpu_is_not_a_qemu_guest():
    assert spec(cpu="host").runs_as_container
    assert spec(cpu="cputype=host,flags=+aes").runs_as_container
    assert not spec(cpu=None).runs_as_container
    with pytest.raises(LabError):
        cpu_argument("host")
