"""Authentication as pve-proxy does it: tickets with CSRF tokens, API tokens, 401 with the reason phrase."""

import re
import time
from urllib.parse import quote

import pytest
from proxmoxer import AuthenticationError, ProxmoxAPI, ResourceException


def test_ticket_login_answers_ticket_and_csrf_token(http, conn):
    data = http.login()
    assert data["username"] == conn["api_user"]
    assert re.match(r"^PVE:root@pam:[0-9A-F]{8}::\S+$", data["ticket"])
    assert re.match(r"^[0-9A-F]{8}:\S+$", data["CSRFPreventionToken"])


def test_proxmoxer_with_ticket_reads_and_writes(ticket_api, conn, vms, tasks):
    node = ticket_api.nodes(conn["pve_node"])
    assert ticket_api.version.get()["version"].startswith("8.")
    vmid = vms.track(vms.free_id())
    tasks.ok(node.qemu.create(vmid=vmid, name="ticket-write"))  # a write: proxmoxer sends the CSRF token
    node.qemu(vmid).config.put(description="written with a ticket")
    assert node.qemu(vmid).config.get()["description"] == "written with a ticket"


def test_a_ticket_renews_itself_as_password(http, conn):
    first = http.login()
    answer = http.request("POST", "/api2/json/access/ticket",
                          data={"username": conn["api_user"], "password": first["ticket"]})
    assert answer.status_code == 200
    assert answer.json()["data"]["ticket"].startswith("PVE:root@pam:")


def test_a_ticket_past_its_lifetime_is_refused_and_cannot_renew_itself(http, conn, api, faults):
    """PVE::AccessControl::verify_ticket refuses a ticket older than its lifetime (two hours; the lab's fault
    shortens it) with "permission denied - invalid PVE ticket", and renewing with it fails as a wrong password."""
    faults.set(ticket_lifetime=2)
    ticket = http.login()["ticket"]
    cookie = {"Cookie": "PVEAuthCookie=" + quote(ticket)}
    assert http.request("GET", "/api2/json/version", headers=cookie).status_code == 200
    time.sleep(3.2)
    answer = http.request("GET", "/api2/json/version", headers=cookie)
    assert (answer.status_code, answer.reason) == (401, "permission denied - invalid PVE ticket")
    renewal = http.request("POST", "/api2/json/access/ticket", data={"username": conn["api_user"], "password": ticket})
    assert (renewal.status_code, renewal.reason) == (401, "authentication failure")
    assert api.version.get()["version"]  # API tokens have no lifetime
    faults.clear()
    assert http.request("GET", "/api2/json/version", headers=cookie).status_code == 200


def test_wrong_password_is_401_authentication_failure(http, conn):
    answer = http.request("POST", "/api2/json/access/ticket", data={"username": "root@pam", "password": "nope"})
    assert (answer.status_code, answer.reason) == (401, "authentication failure")
    with pytest.raises(AuthenticationError):
        ProxmoxAPI(conn["api_host"], port=conn["api_port"], user="root@pam", password="nope",
                   verify_ssl=conn["ca_cert"])


def test_unauthenticated_call_is_401_no_ticket(http):
    answer = http.request("GET", "/api2/json/version")
    assert (answer.status_code, answer.reason) == (401, "No ticket")
    assert answer.content == b""  # pve-proxy answers auth failures without a body


def test_invalid_ticket_is_401(http):
    answer = http.request("GET", "/api2/json/version", headers={"Cookie": "PVEAuthCookie=PVE:root@pam:00000000::x"})
    assert (answer.status_code, answer.reason) == (401, "permission denied - invalid PVE ticket")


def test_token_auth_reads_without_ticket(api, conn):
    assert [n["node"] for n in api.nodes.get()] == [conn["pve_node"]]


def test_wrong_token_secret_is_401(http, conn):
    headers = {"Authorization": "PVEAPIToken=%s=00000000-0000-0000-0000-000000000000" % conn["api_token_id"]}
    answer = http.request("GET", "/api2/json/version", headers=headers)
    assert (answer.status_code, answer.reason) == (401, "invalid token value!")


def test_unknown_token_is_401(http, conn):
    headers = {"Authorization": "PVEAPIToken=root@pam!nosuchtoken=%s" % conn["api_token_secret"]}
    answer = http.request("GET", "/api2/json/version", headers=headers)
    assert (answer.status_code, answer.reason) == (401, "no such token 'nosuchtoken' for user 'root@pam'")


def test_ticket_write_without_csrf_token_is_refused(http, conn, vms):
    vmid = vms.create(name="csrf")
    ticket = http.login()
    cookie = {"Cookie": "PVEAuthCookie=" + quote(ticket["ticket"], safe="")}
    path = "/api2/json/nodes/%s/qemu/%d/config" % (conn["pve_node"], vmid)
    refused = http.request("PUT", path, headers=cookie, data={"description": "no csrf"})
    assert (refused.status_code, refused.reason) == (401, "Permission denied - invalid csrf token")
    assert http.request("GET", path, headers=cookie).status_code == 200  # reads need no CSRF token
    with_csrf = dict(cookie, CSRFPreventionToken=ticket["CSRFPreventionToken"])
    assert http.request("PUT", path, headers=with_csrf, data={"description": "with csrf"}).status_code == 200
    assert http.api("PUT", path[len("/api2/json"):], data={"description": "token"}).status_code == 200


def test_proxmoxer_error_carries_the_reason_phrase(node):
    with pytest.raises(ResourceException) as caught:
        node.qemu(9999999).config.get()
    assert caught.value.status_code == 500
    assert caught.value.content == "Configuration file 'nodes/pve/qemu-server/9999999.conf' does not exist"
