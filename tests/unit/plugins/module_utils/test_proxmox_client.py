"""The client's pure parts: PVE's error shapes, connection settings, task ids. Its HTTP side runs against the lab
(tests/e2e/test_proxmox_client_lab.py)."""

import pytest
import requests
from proxmoxer import ResourceException

from ansible_collections.llmgw.fleet.plugins.module_utils import proxmox_errors as errors
from ansible_collections.llmgw.fleet.plugins.module_utils.proxmox_client import (
    ConnectionSettings,
    ProxmoxClient,
    parse_upid,
    settings_from_params,
    task_succeeded,
)

UPID = "UPID:pve:0001B2C3:0123ABCD:6650F00D:qmclone:9000:root@pam:"


@pytest.mark.parametrize(
    "status, reason, errs, cls",
    [
        (500, "Configuration file 'nodes/pve/qemu-server/1105.conf' does not exist", None, errors.NotFound),
        (500, "unable to create VM 1105 - VM 1105 already exists on node 'pve'", None, errors.AlreadyExists),
        (400, "Parameter verification failed.", {"vmid": "VM 1105 already exists"}, errors.AlreadyExists),
        (500, "VM is locked (clone)", None, errors.Locked),
        (500, "can't lock file '/var/lock/qemu-server/lock-1105.conf' - got timeout", None, errors.Locked),
        (500, "detected modified configuration - file changed by other user? Try again.", None, errors.ConfigChanged),
        (500, "checksum missmatch (file change by other user?)", None, errors.ConfigChanged),
        (500, "checksum mismatch (file change by other user?)", None, errors.ConfigChanged),
        (400, "Parameter verification failed.", {"sshkeys": "invalid urlencoded string"}, errors.ParameterError),
        (400, "Parameter verification failed.", {"vmid": "value does not look like a valid VM ID"},
         errors.ParameterError),
        (401, "authentication failure", None, errors.AuthError),
        (401, "invalid csrf token", None, errors.AuthError),
        (403, "Permission check failed (/vms/1105, VM.Allocate)", None, errors.PermissionDenied),
        (501, "Method 'GET /nodes/pve/qemu/1105/pending' not implemented", None, errors.NotFound),
        (500, "no such VM ('1105')", None, errors.NotFound),
        (595, "Connection refused", None, errors.ConnectionFailed),
        (500, "unexpected error", None, errors.ProxmoxError),
    ],
)
def test_pve_error_shapes_become_typed_errors(status, reason, errs, cls):
    error = errors.classify(status, reason, errs)
    assert error.__class__ is cls
    assert error.status == status and error.reason == reason
    assert reason in str(error)
    for key, text in (errs or {}).items():
        assert key in str(error) and text in str(error)


def test_every_typed_error_is_a_proxmox_error():
    for cls in (errors.NotFound, errors.AlreadyExists, errors.Locked, errors.AuthError, errors.TaskFailed,
                errors.Timeout, errors.ConfigChanged, errors.ParameterError, errors.TLSVerificationFailed):
        assert issubclass(cls, errors.ProxmoxError)
    assert issubclass(errors.TLSVerificationFailed, errors.ConnectionFailed)


def test_settings_fall_back_to_environment():
    environ = {"PROXMOX_HOST": "127.0.0.1", "PROXMOX_PORT": "8443", "PROXMOX_USER": "root@pam",
               "PROXMOX_PASSWORD": "secret", "PROXMOX_CA_PATH": "/lab/ca.pem"}
    settings = settings_from_params({}, environ)
    assert settings == ConnectionSettings("127.0.0.1", 8443, "root@pam", "secret", None, None, True, "/lab/ca.pem", 30)
    assert settings.auth_method == "password" and settings.verify == "/lab/ca.pem"


def test_parameters_win_over_environment():
    settings = settings_from_params({"api_host": "pve1", "api_user": "a@pve", "api_password": "p"},
                                    {"PROXMOX_HOST": "other", "PROXMOX_USER": "b@pve"})
    assert (settings.host, settings.user, settings.port) == ("pve1", "a@pve", 8006)


def test_whole_token_id_supplies_the_user_and_token_wins_over_password():
    settings = settings_from_params({"api_host": "pve", "api_token_id": "ansible@pve!fleet", "api_token_secret": "s",
                                     "api_password": "ignored"})
    assert (settings.user, settings.token_id, settings.token_secret) == ("ansible@pve", "fleet", "s")
    assert settings.password is None and settings.auth_method == "token"


def test_token_user_disagreeing_with_api_user_is_refused():
    with pytest.raises(errors.ProxmoxError, match="agree"):
        settings_from_params({"api_host": "pve", "api_user": "root@pam", "api_token_id": "ansible@pve!fleet",
                              "api_token_secret": "s"})


@pytest.mark.parametrize(
    "params, missing",
    [
        ({}, "api_host"),
        ({"api_host": "pve", "api_password": "p"}, "api_user"),
        ({"api_host": "pve", "api_user": "root@pam"}, "api_password"),
        ({"api_host": "pve", "api_user": "root@pam", "api_token_id": "fleet"}, "api_token_secret"),
    ],
)
def test_missing_connection_parameters_are_named(params, missing):
    with pytest.raises(errors.ProxmoxError) as caught:
        settings_from_params(params, {})
    assert missing in str(caught.value) and "PROXMOX_" in str(caught.value)


def test_certificates_are_verified_unless_switched_off():
    base = {"api_host": "pve", "api_user": "root@pam", "api_password": "p"}
    assert settings_from_params(base).verify is True
    assert settings_from_params(dict(base, ca_path="/ca.pem")).verify == "/ca.pem"
    assert settings_from_params(dict(base, validate_certs=False, ca_path="/ca.pem")).verify is False


def test_upid_names_its_node_type_and_vm():
    info = parse_upid(UPID)
    assert (info["node"], info["type"], info["id"], info["user"]) == ("pve", "qmclone", "9000", "root@pam")
    with pytest.raises(errors.ProxmoxError):
        parse_upid("not-a-upid")


@pytest.mark.parametrize(
    "exitstatus, ok",
    [("OK", True), ("WARNINGS: 2", True), ("clone failed: out of space", False), ("", False), (None, False),
     ("unexpected status", False)],
)
def test_warnings_are_success_and_anything_else_is_failure(exitstatus, ok):
    assert task_succeeded(exitstatus) is ok


RESOURCES = [
    {"vmid": "1105", "name": "node05", "type": "qemu", "node": "pve", "template": 0},
    {"vmid": 105, "name": "node05", "type": "lxc", "node": "pve"},
    {"vmid": 9000, "name": "debian12-cloudinit", "type": "qemu", "node": "pve", "template": 1},
    {"vmid": 1106, "name": "node05", "type": "qemu", "node": "pve2", "template": 0},
]


class ResourcesApi:
    """proxmoxer's shape for the one read find_vms makes: api("cluster/resources").get(type="vm")."""

    def __call__(self, path):
        assert path == "cluster/resources", path

        class Resource:
            @staticmethod
            def get(**params):
                assert params == {"type": "vm"}
                return [dict(entry) for entry in RESOURCES]

        return Resource()


def test_vms_are_found_by_exact_name_or_vmid_never_as_containers():
    client = ProxmoxClient(ResourcesApi())
    assert [(vm["vmid"], vm["node"]) for vm in client.find_vms(name="node05")] == [(1105, "pve"), (1106, "pve2")]
    assert [vm["vmid"] for vm in client.find_vms(vmid="1106")] == [1106]
    assert client.find_vms(vmid=105) == [] and client.find_vms(name="node0") == []
    (template,) = client.find_vms(name="debian12-cloudinit")
    assert template["template"] is True
    assert [vm["vmid"] for vm in client.find_vms(name="node05", vmid=1106)] == [1106]
    assert [vm["vmid"] for vm in client.find_vms()] == [1105, 9000, 1106]


class FlakyApi:
    """Answers each call with the next of ``answers`` (an exception is raised), recording (method, path)."""

    def __init__(self, answers):
        self.answers, self.calls = list(answers), []

    def __call__(self, path):
        api = self

        class Resource:
            def __getattr__(self, method):
                def call(**params):
                    api.calls.append((method, path))
                    answer = api.answers.pop(0)
                    if isinstance(answer, Exception):
                        raise answer
                    return answer
                return call

        return Resource()


def gateway_error(status=503, reason="lab outage"):
    return ResourceException(status, reason, reason)


def test_a_read_meeting_a_gateway_error_is_tried_again_and_a_write_never_is():
    slept = []
    reads = FlakyApi([gateway_error(), gateway_error(), [{"vmid": 1}]])
    assert ProxmoxClient(reads, sleep=slept.append).get("cluster/resources") == [{"vmid": 1}]
    assert reads.calls == [("get", "cluster/resources")] * 3 and slept == [0.5, 1.0]

    writes = FlakyApi([gateway_error(), "UPID:never"])
    with pytest.raises(errors.ProxmoxError) as caught:
        ProxmoxClient(writes, sleep=slept.append).post("nodes/pve/qemu/9000/clone", newid=1105)
    assert writes.calls == [("post", "nodes/pve/qemu/9000/clone")]
    assert str(caught.value) == caught.value.message == (
        "POST /nodes/pve/qemu/9000/clone: HTTP 503: lab outage; not repeated, since it may have been done: run "
        "again, and the run reads what is there first")
    assert caught.value.status == 503


def test_an_answer_slower_than_the_timeout_is_tried_again_for_a_read_and_never_for_a_write():
    slow = requests.exceptions.ReadTimeout("HTTPSConnectionPool(host='pve', port=8006): Read timed out.")
    slept = []
    reads = FlakyApi([slow, slow, {"status": "running"}])
    assert ProxmoxClient(reads, sleep=slept.append).get("nodes/pve/qemu/1105/status/current") == {
        "status": "running"}
    assert reads.calls == [("get", "nodes/pve/qemu/1105/status/current")] * 3 and slept == [0.5, 1.0]

    always = FlakyApi([slow] * 3)
    with pytest.raises(errors.Timeout) as caught:
        ProxmoxClient(always, sleep=slept.append).get("cluster/resources")
    assert len(always.calls) == 3 and "did not answer GET /cluster/resources in time" in caught.value.message

    writes = FlakyApi([slow, "UPID:never"])
    with pytest.raises(errors.Timeout) as caught:
        ProxmoxClient(writes, sleep=slept.append).post("nodes/pve/qemu/9000/clone", newid=1105)
    assert writes.calls == [("post", "nodes/pve/qemu/9000/clone")]
    assert caught.value.message.startswith("POST /nodes/pve/qemu/9000/clone: the Proxmox API did not answer")
    assert caught.value.message.endswith("; not repeated, since it may have been done: run again, and the run reads "
                                         "what is there first")


def test_a_write_refused_outright_keeps_pve_s_own_words():
    writes = FlakyApi([gateway_error(403, "Permission check failed (/vms/1105, VM.Allocate)")])
    with pytest.raises(errors.PermissionDenied) as caught:
        ProxmoxClient(writes).post("nodes/pve/qemu/9000/clone", newid=1105)
    assert writes.calls == [("post", "nodes/pve/qemu/9000/clone")]  # a 403 is never tried again
    assert caught.value.message == (
        "POST /nodes/pve/qemu/9000/clone: HTTP 403: Permission check failed (/vms/1105, VM.Allocate); the API token "
        "(or user) lacks VM.Allocate on /vms/1105: grant it (docs/real-proxmox.md, step 3: the LLMGWFleet role), "
        "then run again")
    assert (caught.value.acl_path, caught.value.privileges) == ("/vms/1105", ("VM.Allocate",))


def test_a_refusal_where_any_of_two_privileges_would_do_names_both():
    error = errors.classify(403, "Permission check failed (/vms/1105, VM.Config.Cloudinit|VM.Config.Network)")
    assert isinstance(error, errors.PermissionDenied)
    assert error.privileges == ("VM.Config.Cloudinit", "VM.Config.Network")
    assert "lacks VM.Config.Cloudinit or VM.Config.Network on /vms/1105" in error.message


def test_a_403_without_pve_s_privilege_text_stays_as_it_came():
    error = errors.classify(403, "Permission check failed")
    assert (error.message, error.acl_path, error.privileges) == ("HTTP 403: Permission check failed", None, ())


def test_privileges_reads_what_the_token_holds_on_one_path():
    class Answers:
        def __init__(self):
            self.asked = []

        def __call__(self, path):
            self.asked.append(path)
            return self

        def get(self, **params):
            self.asked.append(params)
            return {"/vms/1105": {"VM.Audit": 1, "VM.PowerMgmt": 1}}

    api = Answers()
    assert ProxmoxClient(api).privileges("/vms/1105") == {"VM.Audit", "VM.PowerMgmt"}
    assert ProxmoxClient(api).privileges("/storage/local-lvm") == set()
    assert api.asked[:2] == ["access/permissions", {"path": "/vms/1105"}]


def expired_ticket():
    return ResourceException(401, "permission denied - invalid PVE ticket", "")


def test_a_ticket_pve_no_longer_takes_is_replaced_by_a_new_login_once(monkeypatch):
    password = ConnectionSettings("pve", 8006, "root@pam", "secret", None, None, True, None, 30)
    old, new = FlakyApi([expired_ticket()]), FlakyApi([{"upid": "UPID:x"}])
    logins = []
    monkeypatch.setattr(ProxmoxClient, "_session", staticmethod(lambda settings: logins.append(settings) or new))
    # a write: PVE refused it before doing anything, so it is made again on the new ticket
    assert ProxmoxClient(old, settings=password).post("nodes/pve/qemu/9000/clone", newid=1105) == {"upid": "UPID:x"}
    assert (old.calls, new.calls, logins) == ([("post", "nodes/pve/qemu/9000/clone")],
                                              [("post", "nodes/pve/qemu/9000/clone")], [password])


def test_a_refused_token_or_a_second_401_is_not_tried_again(monkeypatch):
    token = ConnectionSettings("pve", 8006, "llmgw@pve", None, "fleet", "s", True, None, 30)
    password = ConnectionSettings("pve", 8006, "root@pam", "secret", None, None, True, None, 30)
    logins = []
    monkeypatch.setattr(ProxmoxClient, "_session",
                        staticmethod(lambda settings: logins.append(settings) or FlakyApi([expired_ticket()])))
    with pytest.raises(errors.AuthError):
        ProxmoxClient(FlakyApi([expired_ticket()]), settings=token).get("version")
    assert logins == []
    with pytest.raises(errors.AuthError):
        ProxmoxClient(FlakyApi([expired_ticket()]), settings=password).get("version")
    assert logins == [password]
