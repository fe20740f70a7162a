"""llmgw.fleet.pve_vm on the lab, through ansible-playbook: every state in four steps, and what changes between."""

import pytest
from pve_vm_e2e import PREFIX, assert_ok, four_steps, lab_session, vm_args

from ansible_collections.llmgw.fleet.plugins.module_utils.vm_plan import cpu_model, decode_sshkeys, sshkey_set


@pytest.fixture(scope="module")
def lab():
    yield from lab_session()


def assert_fleet_config(lab, vmid, args):
    config = lab.config(vmid)
    assert config["name"] == args["name"]
    assert config["cpu"] == args.get("cpu", "host")
    assert config["ipconfig0"] in ("ip=%s,gw=%s" % (args["address"], args["gateway"]),
                                   "gw=%s,ip=%s" % (args["gateway"], args["address"]))
    assert config["ciuser"] == args["ciuser"]
    assert sshkey_set(decode_sshkeys(config["sshkeys"])) == sshkey_set(args["sshkeys"])
    assert any("cloudinit" in str(config.get(slot, "")) for slot in ("ide0", "ide1", "ide2", "ide3", "scsi1"))
    return config


def test_present_clones_and_configures_a_stopped_vm(lab, tmp_path):
    args = vm_args(lab, "present", 201, state="present")
    result = four_steps(lab, tmp_path, args)
    assert result["vmid"] == 1201 and result["node"] == lab.node and result["status"] == "stopped"
    assert result["cpu"] == "host" and result["address"] == "10.77.0.201/24"
    assert result["diff"]["before"]["state"] == "absent" and result["diff"]["after"]["state"] == "present"
    assert_fleet_config(lab, 1201, args)
    assert lab.status(1201) == "stopped"


def test_started_clones_configures_and_starts(lab, tmp_path):
    args = vm_args(lab, "started", 202, state="started")
    result = four_steps(lab, tmp_path, args)
    assert result["vmid"] == 1202 and result["status"] == "running"
    assert result["diff"]["after"]["status"] == "running"
    assert_fleet_config(lab, 1202, args)
    assert lab.status(1202) == "running"


def test_stopped_shuts_a_running_vm_down(lab, tmp_path):
    args = vm_args(lab, "stopped", 203, state="started")
    assert_ok(lab.run(tmp_path, args))
    assert lab.status(1203) == "running"
    result = four_steps(lab, tmp_path, dict(args, state="stopped"))
    assert result["diff"] == {"before": {"status": "running"}, "after": {"status": "stopped"}}
    assert lab.status(1203) == "stopped"


def test_absent_removes_only_the_named_vm(lab, tmp_path):
    args = vm_args(lab, "absent", 204, state="present")
    assert_ok(lab.run(tmp_path, args))
    neighbour = vm_args(lab, "neighbour", 205, state="present")
    assert_ok(lab.run(tmp_path, neighbour))
    result = four_steps(lab, tmp_path, dict(args, state="absent"))
    assert result["status"] == "absent" and result["vmid"] == 1204
    assert result["diff"] == {"before": {"state": "present"}, "after": {"state": "absent"}}
    assert lab.vm(PREFIX + "absent") is None
    assert lab.vm(PREFIX + "neighbour")["vmid"] == 1205


def test_absent_of_a_missing_vm_changes_nothing(lab, tmp_path):
    before = lab.snapshot()
    result = lab.run(tmp_path, {"name": PREFIX + "never-made", "state": "absent"})
    assert_ok(result)
    assert result["changed"] is False and result["status"] == "absent" and result["vmid"] is None
    assert lab.snapshot() == before


def test_changes_to_a_running_vm_are_reported_until_a_reboot_applies_them(lab, tmp_path):
    args = vm_args(lab, "reboot", 206, state="started", memory=1024)
    assert_ok(lab.run(tmp_path, args))
    changed = dict(args, memory=1536)

    result = lab.run(tmp_path, changed)
    assert_ok(result)
    assert result["changed"] is True and result["diff"]["after"] == {"memory": 1536}
    assert result["reboot_required"] is True and "memory" in result["pending"]
    assert any("memory" in w and "next boot" in w for w in result.get("warnings", []))

    # The change is in the config now; what is left is the reboot, and it keeps being reported.
    again = lab.run(tmp_path, changed)
    assert_ok(again)
    assert again["changed"] is False and again["reboot_required"] is True and "memory" in again["pending"]

    rebooted = lab.run(tmp_path, dict(changed, reboot_if_needed=True))
    assert_ok(rebooted)
    assert rebooted["changed"] is True and rebooted["diff"]["after"] == {"reboot": "rebooted"}
    settled = lab.run(tmp_path, dict(changed, reboot_if_needed=True))
    assert_ok(settled)
    assert settled["changed"] is False and settled["reboot_required"] is False and settled["pending"] == []
    assert lab.status(1206) == "running"


def test_changes_to_a_stopped_vm_need_no_reboot(lab, tmp_path):
    args = vm_args(lab, "cold", 207, state="present", cores=1)
    assert_ok(lab.run(tmp_path, args))
    extra_key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIE4pI0qvGKY5Ca7z0kk8r3Tqb7FEAPOWcUpCIkHNO2yl second@fleet"
    changed = dict(args, cores=2, sshkeys=[args["sshkeys"], extra_key])
    result = lab.run(tmp_path, changed)
    assert_ok(result)
    assert set(result["diff"]["after"]) == {"cores", "sshkeys"}
    assert result["reboot_required"] is False
    config = lab.config(1207)
    assert int(config["cores"]) == 2
    assert sshkey_set(decode_sshkeys(config["sshkeys"])) == sshkey_set(args["sshkeys"] + "\n" + extra_key)
    # The same keys in another order, with other comments, are no change.
    reordered = dict(changed, sshkeys=extra_key.replace("second@fleet", "") + "\n" + args["sshkeys"] + "\n")
    assert lab.run(tmp_path, reordered)["changed"] is False


def test_half_made_vm_from_an_interrupted_run_is_finished(lab, tmp_path):
    lab.clone_bare(1208, PREFIX + "half")
    bare = lab.config(1208)
    assert "ipconfig0" not in bare or bare.get("ipconfig0") != "ip=10.77.0.208/24,gw=%s" % lab.gateway
    args = vm_args(lab, "half", 208, state="started")
    result = lab.run(tmp_path, args)
    assert_ok(result)
    assert result["changed"] is True and "state" not in result["diff"]["after"]
    assert {"ipconfig0", "sshkeys", "status"} <= set(result["diff"]["after"])
    assert_fleet_config(lab, 1208, args)
    assert lab.status(1208) == "running"
    assert lab.run(tmp_path, args)["changed"] is False


def test_slow_cpu_is_allowed_only_when_asked_and_then_warned_about(lab, tmp_path):
    args = vm_args(lab, "slowcpu", 209, state="present", cpu="kvm64")
    before = lab.snapshot()
    refused = lab.run(tmp_path, args)
    assert refused.get("failed") and "allow_slow_cpu" in refused["msg"] and "libggml-cpu-x64.so" in refused["msg"]
    assert lab.snapshot() == before

    allowed = lab.run(tmp_path, dict(args, allow_slow_cpu=True))
    assert_ok(allowed)
    assert allowed["cpu"] == "kvm64"
    warning = " ".join(allowed.get("warnings", []))
    assert "libggml-cpu-x64.so" in warning and "6.7x" in warning and "18.9x" in warning
    # The template has no cpu key, which PVE runs as kvm64: nothing to write, and nothing was written.
    assert cpu_model(lab.config(1209).get("cpu")) == "kvm64"


def test_explicit_vmid_wins_over_the_derivation(lab, tmp_path):
    args = vm_args(lab, "explicit", 210, state="present", vmid=3210)
    result = lab.run(tmp_path, args)
    assert_ok(result)
    assert result["vmid"] == 3210 and lab.vm(PREFIX + "explicit")["vmid"] == 3210


def test_info_reads_vms_with_effective_cpu_and_decoded_keys(lab, tmp_path):
    args = vm_args(lab, "info", 211, state="present")
    assert_ok(lab.run(tmp_path, args))
    result = lab.run(tmp_path, {"name": PREFIX + "info"}, module="llmgw.fleet.pve_vm_info")
    assert_ok(result)
    assert result["changed"] is False
    (vm,) = result["vms"]
    assert (vm["vmid"], vm["name"], vm["node"], vm["cpu"], vm["address"]) == (
        1211, PREFIX + "info", lab.node, "host", "10.77.0.211/24")
    assert vm["slow_cpu_variant"] is None and vm["ciuser"] == "debian"
    assert sshkey_set("\n".join(vm["sshkeys"])) == sshkey_set(lab.ssh_public_key)

    template = lab.run(tmp_path, {"vmid": lab.template_vmid, "include_config": True},
                       module="llmgw.fleet.pve_vm_info")
    (tvm,) = template["vms"]
    assert tvm["template"] is True and tvm["name"] == lab.template_name and "digest" in tvm["config"]


def test_password_login_and_environment_fallbacks(lab, tmp_path):
    result = lab.run(tmp_path, {"vmid": lab.template_vmid}, module="llmgw.fleet.pve_vm_info",
                     defaults=lab.password_defaults())
    assert_ok(result)
    assert result["vms"][0]["vmid"] == lab.template_vmid

    conn = lab.module_defaults()
    env = {"PROXMOX_HOST": conn["api_host"], "PROXMOX_PORT": str(conn["api_port"]),
           "PROXMOX_TOKEN_ID": conn["api_token_id"], "PROXMOX_TOKEN_SECRET": conn["api_token_secret"],
           "PROXMOX_CA_PATH": conn["ca_path"]}
    result = lab.run(tmp_path, {"vmid": lab.template_vmid}, module="llmgw.fleet.pve_vm_info", defaults={}, env=env)
    assert_ok(result)
    assert result["vms"][0]["name"] == lab.template_name


def test_certificates_are_verified_by_default(lab, tmp_path):
    conn = dict(lab.module_defaults())
    del conn["ca_path"]
    result = lab.run(tmp_path, {"vmid": lab.template_vmid}, module="llmgw.fleet.pve_vm_info", defaults=conn)
    assert result.get("failed") and "ca_path" in result["msg"] and "TLS" in result["msg"]


def test_secrets_never_reach_the_output(lab, tmp_path):
    conn = lab.module_defaults()
    result = lab.run(tmp_path, {"vmid": lab.template_vmid}, module="llmgw.fleet.pve_vm_info")
    assert conn["api_token_secret"] not in result["_stdout"]
    assert conn["api_token_secret"] not in str(result.get("invocation", ""))


def test_failed_task_is_reported_at_once_with_its_log_and_the_next_run_finishes(lab, tmp_path):
    args = vm_args(lab, "taskfail", 212, state="started")
    assert_ok(lab.run(tmp_path, dict(args, state="present")))
    lab.inject({"fail_next_task": {"message": "start failed: injected by the test", "type": "qmstart",
                                   "vmid": 1212}})
    failed = lab.run(tmp_path, args)
    assert failed.get("failed")
    assert "qmstart" in failed["msg"] and "injected by the test" in failed["msg"] and "task log" in failed["msg"]
    assert failed["upid"].startswith("UPID:") and failed["task_log"]
    assert lab.status(1212) == "stopped"
    finished = lab.run(tmp_path, args)
    assert_ok(finished)
    assert finished["changed"] is True and finished["diff"]["after"] == {"status": "running"}


def test_vmid_that_is_the_next_free_id_is_warned_about(lab, tmp_path):
    vmid = lab.client.next_free_id()
    result = lab.run(tmp_path, vm_args(lab, "nextid", 213, vmid=vmid))
    assert_ok(result)
    assert result["vmid"] == vmid
    assert any("next free id" in w and str(vmid) in w for w in result.get("warnings", []))


def test_vmid_block_holding_the_next_free_id_is_warned_about(lab, tmp_path):
    # vmid_base 0 (the VMID is the last octet, as the fleet was first built by hand) puts the fleet's ids where
    # PVE hands out ids to VMs created without one.
    assert lab.client.next_free_id() <= 255
    result = lab.run(tmp_path, vm_args(lab, "base0", 214, vmid_base=0))
    assert_ok(result)
    assert result["vmid"] == 214
    assert any("next free VMID" in w and "0-255" in w for w in result.get("warnings", []))
    quiet = lab.run(tmp_path, vm_args(lab, "base1000", 215))
    assert_ok(quiet)
    assert not [w for w in quiet.get("warnings", []) if "next free" in w]
