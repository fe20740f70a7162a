from urllib.parse import quote

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ansible_collections.llmgw.fleet.plugins.module_utils import vm_plan
from ansible_collections.llmgw.fleet.plugins.module_utils.vm_plan import DesiredVM, PlanError, plan_config

KEY_A = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIE4pI0qvGKY5Ca7z0kk8r3Tqb7FEAPOWcUpCIkHNO2yl alice@laptop"
KEY_B = "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQC7 bob@desk"


# ---- VMID derivation ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "address, base, expected",
    [
        ("10.77.0.105/24", 1000, 1105),
        ("10.77.0.1/24", 1000, 1001),
        ("10.77.0.254/24", 1000, 1254),
        ("10.77.0.105/24", 0, 105),
        ("10.77.0.105/24", 5000, 5105),
        ("192.168.7.100/24", 0, 100),
        ("10.1.2.0/16", 1000, 1000),  # .0 is a host address in a /16
        ("10.1.2.255/16", 1000, 1255),
    ],
)
def test_vmid_is_base_plus_last_octet(address, base, expected):
    assert vm_plan.derive_vmid(address, base) == expected


def test_default_base_is_1000():
    assert vm_plan.DEFAULT_VMID_BASE == 1000
    assert vm_plan.derive_vmid("10.77.0.105/24") == 1105


def test_explicit_vmid_wins_over_the_address():
    assert vm_plan.derive_vmid("10.77.0.105/24", 1000, vmid=4242) == 4242
    assert vm_plan.derive_vmid(None, 1000, vmid=4242) == 4242


@pytest.mark.parametrize("address, base", [("10.77.0.99/24", 0), ("10.77.0.5/24", 0), ("10.77.0.1/24", 50)])
def test_vmid_below_100_is_refused_with_the_arithmetic(address, base):
    with pytest.raises(PlanError) as caught:
        vm_plan.derive_vmid(address, base)
    message = str(caught.value)
    assert "below 100" in message and str(base) in message and address in message


@pytest.mark.parametrize("vmid", [99, 0, -5, 1000000000])
def test_explicit_vmid_outside_pve_range_is_refused(vmid):
    with pytest.raises(PlanError):
        vm_plan.derive_vmid(None, 1000, vmid=vmid)


@pytest.mark.parametrize(
    "address, why",
    [
        ("10.77.0.105", "prefix"),
        ("10.77.0.256/24", "not an IPv4"),
        ("10.77.0/24", "not an IPv4"),
        ("fe80::1/64", "not an IPv4"),
        ("node05/24", "not an IPv4"),
        ("10.77.0.0/24", "network address"),
        ("10.77.0.255/24", "broadcast address"),
        ("10.77.0.105/33", "not an IPv4"),
        ("", "prefix"),
    ],
)
def test_bad_addresses_are_refused(address, why):
    with pytest.raises(PlanError) as caught:
        vm_plan.derive_vmid(address, 1000)
    assert why in str(caught.value)


def test_no_address_and_no_vmid_is_refused():
    with pytest.raises(PlanError):
        vm_plan.derive_vmid(None, 1000)


def test_negative_base_is_refused():
    with pytest.raises(PlanError):
        vm_plan.derive_vmid("10.77.0.200/24", -100)


@given(st.integers(1, 254), st.integers(100, 10000))
def test_derivation_is_base_plus_octet_for_every_host_of_a_24(octet, base):
    assert vm_plan.derive_vmid("10.77.0.%d/24" % octet, base) == base + octet


def test_next_id_inside_the_fleet_block_is_warned_about():
    warning = vm_plan.next_id_clash(1105, 1010, vmid_base=1000)
    assert warning and "1010" in warning and "1000-1255" in warning and "next-id" in warning


def test_next_id_outside_the_fleet_block_is_quiet():
    assert vm_plan.next_id_clash(1105, 100, vmid_base=1000) is None
    assert vm_plan.next_id_clash(1105, 1256, vmid_base=1000) is None


def test_explicit_vmid_that_is_the_next_free_id_is_warned_about():
    assert "4242" in vm_plan.next_id_clash(4242, 4242)
    assert vm_plan.next_id_clash(4242, 100) is None


# ---- ipconfig0 ------------------------------------------------------------------------------------------------


def test_ipconfig0_carries_address_prefix_and_gateway():
    assert vm_plan.ipconfig0_for("10.77.0.105/24", "10.77.0.1") == "ip=10.77.0.105/24,gw=10.77.0.1"
    assert vm_plan.ipconfig0_for("10.77.0.105/24") == "ip=10.77.0.105/24"


@pytest.mark.parametrize("gateway", ["10.78.0.1", "10.77.0.105", "gateway"])
def test_gateway_outside_the_network_or_the_node_itself_is_refused(gateway):
    with pytest.raises(PlanError):
        vm_plan.ipconfig0_for("10.77.0.105/24", gateway)


def test_address_of_reads_static_ip_and_ignores_dhcp():
    assert vm_plan.address_of({"ipconfig0": "gw=10.77.0.1,ip=10.77.0.105/24"}) == "10.77.0.105/24"
    assert vm_plan.address_of({"ipconfig0": "ip=dhcp"}) is None
    assert vm_plan.address_of({}) is None


def test_same_host_ip_ignores_prefix():
    assert vm_plan.same_host_ip("10.77.0.105/24", "10.77.0.105/16")
    assert not vm_plan.same_host_ip("10.77.0.105/24", "10.77.0.106/24")
    assert not vm_plan.same_host_ip(None, "10.77.0.106/24")


# ---- cpu ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, model",
    [(None, "kvm64"), ("", "kvm64"), ("host", "host"), ("cputype=host,flags=+aes", "host"), ("x86-64-v3", "x86-64-v3")],
)
def test_cpu_model_reads_missing_as_kvm64(value, model):
    assert vm_plan.cpu_model(value) == model


@pytest.mark.parametrize(
    "cpu, variant",
    [("kvm64", "x64"), (None, "x64"), ("qemu64", "x64"), ("x86-64-v2", "sse42"), ("x86-64-v2-AES", "sse42")],
)
def test_slow_cpu_refused_without_override_and_warned_with_it(cpu, variant):
    with pytest.raises(PlanError) as caught:
        vm_plan.check_cpu(cpu, allow_slow_cpu=False)
    assert "allow_slow_cpu" in str(caught.value)
    warning = vm_plan.check_cpu(cpu, allow_slow_cpu=True)
    assert "libggml-cpu-%s.so" % variant in warning
    assert "6.7x slower generation" in warning and "18.9x slower prompt processing" in warning


@pytest.mark.parametrize("cpu", ["host", "x86-64-v3", "x86-64-v4", "host,flags=+pdpe1gb"])
def test_fast_cpus_need_no_override(cpu):
    assert vm_plan.check_cpu(cpu, allow_slow_cpu=False) is None


# ---- sshkeys --------------------------------------------------------------------------------------------------


def test_sshkeys_encoding_is_what_pve_accepts():
    encoded = vm_plan.encode_sshkeys(KEY_A + "\n")
    assert "+" not in encoded and " " not in encoded and "%20" in encoded and "%0A" in encoded
    assert encoded == quote(KEY_A + "\n", safe="")
    assert vm_plan.decode_sshkeys(encoded) == KEY_A + "\n"


def test_key_sets_ignore_order_comments_and_blank_lines():
    one = vm_plan.sshkey_set(KEY_A + "\n" + KEY_B + "\n")
    other = vm_plan.sshkey_set("\n# fleet keys\n" + KEY_B.replace("bob@desk", "bob") + "\n\n  " + KEY_A + "  \n")
    assert one == other
    assert vm_plan.sshkey_set(KEY_A) != one


def test_normalize_sshkeys_takes_a_list_or_text():
    assert vm_plan.normalize_sshkeys([KEY_A, KEY_B]) == KEY_A + "\n" + KEY_B + "\n"
    assert vm_plan.normalize_sshkeys(" " + KEY_A + "\n\n") == KEY_A + "\n"


# ---- plan -----------------------------------------------------------------------------------------------------


def desired(**overrides):
    values = dict(
        name="node05",
        vmid=1105,
        cpu="host",
        cores=4,
        memory=8192,
        ciuser="debian",
        sshkeys=KEY_A,
        ipconfig0="ip=10.77.0.105/24,gw=10.77.0.1",
        nameserver="10.77.0.1",
        searchdomain="fleet.internal",
    )
    values.update(overrides)
    return DesiredVM(**values)


def converged_config(**overrides):
    config = {
        "name": "node05",
        "cpu": "host",
        "cores": 4,
        "memory": "8192",
        "ciuser": "debian",
        "sshkeys": quote("# note\n" + KEY_A.replace("alice@laptop", "") + "\n", safe=""),
        "ipconfig0": "gw=10.77.0.1,ip=10.77.0.105/24",
        "nameserver": "10.77.0.1",
        "searchdomain": "fleet.internal",
        "ide2": "local-lvm:vm-1105-cloudinit,media=cdrom",
        "scsi0": "local-lvm:vm-1105-disk-0,size=4G",
        "digest": "0123abcd",
    }
    config.update(overrides)
    return config


def test_converged_config_plans_nothing():
    plan = plan_config(desired(), converged_config(), running=True)
    assert plan.empty and plan.params == {} and plan.reboot_keys == []


def test_missing_cpu_reads_as_kvm64_and_is_changed_to_host():
    config = converged_config()
    del config["cpu"]
    plan = plan_config(desired(), config)
    assert [(c.key, c.before, c.after) for c in plan.changes] == [("cpu", "kvm64", "host")]
    assert plan.params == {"cpu": "host"}


def test_explicit_kvm64_matches_a_config_without_cpu():
    config = converged_config()
    del config["cpu"]
    assert plan_config(desired(cpu="kvm64"), config).empty


def test_changed_keys_are_sent_encoded_and_shown_decoded():
    plan = plan_config(desired(sshkeys=[KEY_A, KEY_B]), converged_config())
    (change,) = plan.changes
    assert change.key == "sshkeys" and KEY_B in change.after and KEY_B not in change.before
    assert plan.params["sshkeys"] == quote(KEY_A + "\n" + KEY_B + "\n", safe="")
    assert plan.digest == "0123abcd"


def test_changes_on_a_running_vm_need_a_reboot_and_on_a_stopped_one_do_not():
    running = plan_config(desired(memory=16384, onboot=True), converged_config(), running=True)
    assert {c.key: c.needs_reboot for c in running.changes} == {"memory": True, "onboot": False}
    assert running.reboot_keys == ["memory"]
    stopped = plan_config(desired(memory=16384), converged_config(), running=False)
    assert stopped.reboot_keys == []


def test_unmanaged_fields_are_left_alone():
    plan = plan_config(DesiredVM(name="node05", vmid=1105), converged_config(cores=64, memory="1024"))
    assert plan.empty


def test_ipconfig_compared_as_pairs_and_other_keys_count():
    assert plan_config(desired(), converged_config(ipconfig0="ip=10.77.0.105/24,gw=10.77.0.1")).empty
    plan = plan_config(desired(), converged_config(ipconfig0="ip=10.77.0.105/24,gw=10.77.0.1,ip6=dhcp"))
    assert plan.params == {"ipconfig0": "ip=10.77.0.105/24,gw=10.77.0.1"}


def test_memory_in_current_form_and_agent_in_property_form_are_understood():
    config = converged_config(memory="current=8192", agent="enabled=1,fstrim_cloned_disks=1")
    plan = plan_config(desired(agent=True), config)
    assert plan.empty
    plan = plan_config(desired(agent=True), converged_config(agent="0"))
    assert plan.params == {"agent": 1}


def test_nameservers_from_a_list_compare_to_the_spaced_string():
    assert plan_config(desired(nameserver=["10.77.0.1"]), converged_config()).empty
    plan = plan_config(desired(nameserver=["10.77.0.1", "10.77.0.2"]), converged_config())
    assert plan.params == {"nameserver": "10.77.0.1 10.77.0.2"}


def test_missing_cloudinit_drive_is_added_on_ide2():
    config = converged_config()
    del config["ide2"]
    plan = plan_config(desired(cloudinit_storage="local-lvm"), config)
    assert plan.params == {"ide2": "local-lvm:cloudinit"}
    assert plan.changes[0].key == vm_plan.CLOUDINIT_DRIVE_KEY


def test_cloudinit_drive_in_another_slot_counts():
    config = converged_config(ide2="none,media=cdrom", scsi1="local-lvm:vm-1105-cloudinit,media=cdrom")
    assert plan_config(desired(), config).empty


def test_occupied_ide2_without_cloudinit_drive_is_refused():
    config = converged_config(ide2="local:iso/debian.iso,media=cdrom")
    with pytest.raises(PlanError) as caught:
        plan_config(desired(), config)
    assert "ide2" in str(caught.value)


def test_creation_from_nothing_plans_every_managed_key():
    plan = plan_config(desired(cloudinit_storage="local-lvm"), {"name": "node05"})
    assert set(plan.params) == {
        "cpu", "cores", "memory", "ciuser", "sshkeys", "ipconfig0", "nameserver", "searchdomain", "ide2",
    }


def test_unreadable_config_value_is_a_plan_error():
    with pytest.raises(PlanError):
        plan_config(desired(), converged_config(memory="lots"))


def test_invalid_desired_value_is_a_plan_error():
    with pytest.raises(PlanError):
        plan_config(desired(memory="16G"), converged_config())


def test_difference_tracker_drives_changed_and_diff():
    tracker = vm_plan.DifferenceTracker()
    assert tracker.empty
    tracker.add("cpu", "kvm64", "host")
    tracker.add("status", "stopped", "running")
    assert not tracker.empty and tracker.has("cpu") and tracker.names() == ["cpu", "status"]
    assert tracker.before_after() == ({"cpu": "kvm64", "status": "stopped"}, {"cpu": "host", "status": "running"})
