"""GET/PUT/POST config: digest, delete, sshkeys encoding, pending changes of a running VM."""

import re
from urllib.parse import quote, quote_plus, unquote

import pytest
from proxmoxer import ResourceException

ED25519 = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHpOPcaU1Y9iVzGl4r3cRyFzI0JnGa5xWjYoHq0lYX7b lab@test"
RSA_LINE = "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAAAgQDBKy8V7y2e2K3nQkQh1Mgn0qSVWf6A0yK2pYJ7V1l4t0Nw9n4mQZg9fC8q"


def test_digest_refuses_a_stale_write(node, vms):
    config = node.qemu(vms.create(name="digest")).config
    before = config.get()["digest"]
    assert re.match(r"^[0-9a-f]{40}$", before)
    config.put(description="first", digest=before)
    after = config.get()["digest"]
    assert after != before
    with pytest.raises(ResourceException) as caught:
        config.put(description="second", digest=before)
    assert (caught.value.status_code, caught.value.content) == (500, "checksum mismatch (file change by other user?)")
    with pytest.raises(ResourceException):
        config.post(description="second", digest=before)
    assert config.get()["description"] == "first"


def test_delete_removes_keys(node, vms):
    config = node.qemu(vms.create(name="deleting")).config
    config.put(description="x", tags="a;b", onboot=1)
    config.put(delete="description,tags")
    values = config.get()
    assert "description" not in values and "tags" not in values and values["onboot"] == 1


@pytest.mark.parametrize("params, errors", [
    ({"delete": "nosuchoption"}, {"delete": "unknown option 'nosuchoption'"}),
    ({"delete": "onboot", "onboot": 1}, {"delete": "you can't use '-onboot' and -delete onboot' at the same time"}),
])
def test_delete_is_verified(node, vms, params, errors):
    with pytest.raises(ResourceException) as caught:
        node.qemu(vms.create(name="delverify")).config.put(**params)
    assert caught.value.status_code == 400 and caught.value.errors == errors


def test_an_update_without_options_is_500(node, vms):
    with pytest.raises(ResourceException) as caught:
        node.qemu(vms.create(name="nothing")).config.put()
    assert caught.value.content == "no options specified"


def test_post_config_runs_as_a_task(node, vms, tasks):
    config = node.qemu(vms.create(name="async")).config
    upid = config.post(description="async")
    assert ":qmconfig:" in upid
    tasks.ok(upid)
    assert config.get()["description"] == "async"
    upid = config.post(delete="tags")  # not set: a warning, as PVE gives it
    assert tasks.wait(upid)["exitstatus"] == "WARNINGS: 1"
    log = [line["t"] for line in node.tasks(upid).log.get()]
    assert "WARN: cannot delete 'tags' - not set in current configuration!" in log
    assert log[-1] == "TASK WARNINGS: 1"


def test_sshkeys_are_stored_and_returned_url_encoded(node, vms):
    config = node.qemu(vms.create(name="keys")).config
    keys = ED25519 + "\n" + ED25519.replace("lab@test", "second@test")
    encoded = quote(keys, safe="")
    config.put(sshkeys=encoded)
    stored = config.get()["sshkeys"]
    assert stored == encoded
    assert unquote(stored) == keys


@pytest.mark.parametrize("value", [ED25519, quote_plus(ED25519)])
def test_sshkeys_that_are_not_url_encoded_are_400(node, vms, value):
    with pytest.raises(ResourceException) as caught:
        node.qemu(vms.create(name="rawkeys")).config.put(sshkeys=value)
    assert caught.value.status_code == 400
    assert caught.value.errors == {"sshkeys": "invalid format - invalid urlencoded string: %s\n" % value}


@pytest.mark.parametrize("text", ["not a key", RSA_LINE])
def test_sshkeys_must_decode_to_public_keys(node, vms, text):
    with pytest.raises(ResourceException) as caught:
        node.qemu(vms.create(name="badkeys")).config.put(sshkeys=quote(text, safe=""))
    assert (caught.value.status_code, caught.value.content) == (500, "SSH public key validation error")


def test_cloudinit_shows_what_the_drive_holds_and_what_it_will_get(node, vms):
    vm = node.qemu(vms.clone(name="ci"))
    vm.config.put(ciuser="first")
    assert {"key": "ciuser", "value": "first"} in vm.cloudinit.get()
    vm.cloudinit.put()  # regenerate the drive
    vm.config.put(ciuser="second", searchdomain="lab.example")
    pending = vm.cloudinit.get()
    assert {"key": "ciuser", "value": "first", "pending": "second"} in pending
    assert {"key": "searchdomain", "pending": "lab.example"} in pending
    vm.cloudinit.put()
    assert {"key": "ciuser", "value": "second"} in vm.cloudinit.get()


def test_cipassword_reads_back_hidden(node, vms):
    config = node.qemu(vms.create(name="secret")).config
    config.put(cipassword="hunter2")
    assert config.get()["cipassword"] == "**********"


def test_values_come_back_typed_as_pve_types_them(node, vms):
    config = node.qemu(vms.create(name="typed", cores=2, memory=256, onboot=1, agent=1, cpulimit="1.5")).config
    values = config.get()
    assert (values["cores"], values["onboot"], values["cpulimit"]) == (2, 1, 1.5)
    assert (values["memory"], values["agent"]) == ("256", "1")


def test_a_running_vm_takes_cpu_changes_at_its_next_start(node, vms, tasks):
    vm = node.qemu(vms.create(name="pending", cores=1, memory=128))
    tasks.ok(vm.status.start.post())
    vm.config.put(cores=2, description="applied at once")
    assert vm.config.get()["cores"] == 2  # the default view has pending changes applied
    current = vm.config.get(current=1)
    assert (current["cores"], current["description"]) == (1, "applied at once")
    assert {"key": "cores", "value": 1, "pending": 2} in vm.pending.get()
    tasks.ok(vm.status.stop.post())
    tasks.ok(vm.status.start.post())
    assert vm.config.get(current=1)["cores"] == 2
    assert all("pending" not in item for item in vm.pending.get())
