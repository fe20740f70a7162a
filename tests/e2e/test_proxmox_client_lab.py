"""The Proxmox client against the lab's API: authentication, TLS, typed errors, tasks, the config digest."""

from urllib.parse import quote

import pytest
from pve_vm_e2e import PREFIX, TIMEOUT, lab_session

from ansible_collections.llmgw.fleet.plugins.module_utils import proxmox_errors as errors
from ansible_collections.llmgw.fleet.plugins.module_utils.proxmox_client import (
    ProxmoxClient,
    settings_from_params,
    task_succeeded,
)

VMID = 1231


@pytest.fixture(scope="module")
def lab():
    for session in lab_session():
        session.clone_bare(VMID, PREFIX + "client")
        yield session


def connect(params):
    return ProxmoxClient.connect(settings_from_params(params))


def test_token_and_password_logins_both_work(lab):
    for params in (lab.module_defaults(), lab.password_defaults()):
        assert connect(params).version()["version"]


def test_wrong_password_is_an_auth_error(lab):
    with pytest.raises(errors.AuthError):
        connect(dict(lab.password_defaults(), api_password="wrong"))


def test_wrong_token_secret_is_an_auth_error(lab):
    client = connect(dict(lab.module_defaults(), api_token_secret="00000000-0000-0000-0000-000000000000"))
    with pytest.raises(errors.AuthError):
        client.version()


def test_unverified_certificate_is_refused_naming_ca_path(lab):
    params = dict(lab.module_defaults())
    del params["ca_path"]
    with pytest.raises(errors.TLSVerificationFailed) as caught:
        connect(params).version()
    assert "ca_path" in str(caught.value)


def test_missing_vm_is_not_found(lab):
    with pytest.raises(errors.NotFound) as caught:
        lab.client.vm_config(lab.node, 99999)
    assert "does not exist" in str(caught.value)


def test_taken_vmid_is_already_exists(lab):
    with pytest.raises(errors.AlreadyExists):
        lab.client.create_vm(lab.node, VMID, {"name": PREFIX + "dup"}, TIMEOUT)
    with pytest.raises(errors.AlreadyExists):
        lab.client.get("cluster/nextid", vmid=VMID)


def test_next_free_id_is_an_int(lab):
    assert isinstance(lab.client.next_free_id(), int) and lab.client.next_free_id() >= 100


def test_bad_parameter_is_a_parameter_error_naming_it(lab):
    config = lab.config(VMID)
    with pytest.raises(errors.ParameterError) as caught:
        lab.client.update_config(lab.node, VMID, {"sshkeys": "ssh-ed25519+AAAA+me"}, TIMEOUT, digest=config["digest"])
    assert "sshkeys" in caught.value.errors
    assert lab.config(VMID) == config


def test_stale_digest_is_refused_and_changes_nothing(lab):
    config = lab.config(VMID)
    lab.client.update_config(lab.node, VMID, {"ciuser": "first"}, TIMEOUT, digest=config["digest"])
    changed = lab.config(VMID)
    with pytest.raises(errors.ConfigChanged):
        lab.client.update_config(lab.node, VMID, {"ciuser": "second"}, TIMEOUT, digest=config["digest"])
    assert lab.config(VMID) == changed and changed["ciuser"] == "first"


def test_sshkeys_round_trip_url_encoded(lab):
    keys = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIE4pI0qvGKY5Ca7z0kk8r3Tqb7FEAPOWcUpCIkHNO2yl a@b\n"
    config = lab.config(VMID)
    lab.client.update_config(lab.node, VMID, {"sshkeys": quote(keys, safe="")}, TIMEOUT, digest=config["digest"])
    assert lab.config(VMID)["sshkeys"] == quote(keys, safe="")


def test_guests_are_typed_and_containers_kept_apart(lab):
    guests = lab.client.guests()
    assert all(isinstance(g["vmid"], int) and isinstance(g["template"], bool) for g in guests)
    assert {g["type"] for g in lab.client.qemu_vms()} == {"qemu"}
    template = [g for g in guests if g["vmid"] == lab.template_vmid]
    assert template and template[0]["template"] is True


def test_task_waits_end_in_the_task_exit_status(lab):
    upid = lab.client.post("nodes/%s/qemu/%d/status/start" % (lab.node, VMID))
    assert upid.startswith("UPID:%s:" % lab.node)
    assert task_succeeded(lab.client.wait_task(upid, TIMEOUT))
    assert lab.status(VMID) == "running"
    lab.client.stop_vm(lab.node, VMID, TIMEOUT)
    assert lab.status(VMID) == "stopped"


def test_failed_task_raises_at_once_with_its_exit_status_and_log(lab):
    lab.inject({"fail_next_task": {"message": "injected: no space left on device", "type": "qmstart", "vmid": VMID}})
    with pytest.raises(errors.TaskFailed) as caught:
        lab.client.start_vm(lab.node, VMID, TIMEOUT)
    failure = caught.value
    assert "no space left on device" in failure.exitstatus and failure.upid.startswith("UPID:%s:" % lab.node)
    assert failure.log_tail and "no space left on device" in str(failure)
    assert "qmstart" in str(failure) and str(VMID) in str(failure)
    assert lab.status(VMID) == "stopped"


def test_task_still_running_at_the_timeout_is_a_timeout_not_a_failure(lab):
    lab.inject({"task_delay": 3})
    try:
        with pytest.raises(errors.Timeout) as caught:
            lab.client.start_vm(lab.node, VMID, 0.5)
    finally:
        lab.inject({"task_delay": 0})
    assert caught.value.upid and "still running" in str(caught.value) and caught.value.what == "task"
    lab.client.wait_task(caught.value.upid, TIMEOUT)
    lab.client.stop_vm(lab.node, VMID, TIMEOUT)


def test_locked_vm_is_locked(lab):
    lab.inject({"lock": {"vmid": VMID, "lock": "backup"}})
    try:
        with pytest.raises(errors.Locked) as caught:
            lab.client.update_config(lab.node, VMID, {"ciuser": "x"}, TIMEOUT)
        assert "backup" in str(caught.value)
        with pytest.raises(errors.Locked) as waited:
            lab.client.wait_unlocked(lab.node, VMID, 0.3)
        assert waited.value.reason == "backup"
    finally:
        lab.inject({"lock": {"vmid": VMID, "lock": None}})
    assert "lock" not in lab.client.wait_unlocked(lab.node, VMID, 1)


def test_reads_ride_through_a_short_outage_and_writes_are_not_repeated(lab):
    lab.inject({"fail_requests": 2, "status": 503, "message": "proxy: upstream restarting"})
    assert lab.client.vm_config(lab.node, VMID)["name"] == PREFIX + "client"

    lab.inject({"fail_requests": 1, "status": 503, "message": "proxy: upstream restarting"})
    with pytest.raises(errors.ProxmoxError) as caught:
        lab.client.update_config(lab.node, VMID, {"ciuser": "never"}, TIMEOUT)
    assert caught.value.status == 503 and "upstream restarting" in str(caught.value)
    assert lab.config(VMID).get("ciuser") != "never"


def test_a_long_outage_fails_reads_with_the_servers_words(lab):
    lab.inject({"fail_requests": 3, "status": 503, "message": "proxy: upstream restarting"})
    with pytest.raises(errors.ProxmoxError) as caught:
        lab.client.vm_config(lab.node, VMID)
    assert caught.value.status == 503 and "upstream restarting" in str(caught.value)
