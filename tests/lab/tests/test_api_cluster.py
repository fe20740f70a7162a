"""/version, /nodes, node status, storage, /cluster/resources and /cluster/nextid."""

import os

from proxmoxer import ResourceException


def test_version(api):
    version = api.version.get()
    assert set(version) == {"version", "release", "repoid"}
    assert version["version"].startswith(version["release"])


def test_every_answer_is_wrapped_in_data(http):
    answer = http.api("GET", "/version")
    assert answer.status_code == 200
    assert list(answer.json()) == ["data"]
    assert answer.headers["Content-Type"].startswith("application/json")


def test_nodes_lists_the_one_node(api, conn):
    (entry,) = api.nodes.get()
    assert (entry["node"], entry["status"], entry["type"]) == (conn["pve_node"], "online", "node")
    assert entry["maxcpu"] == os.cpu_count()


def test_node_status_reports_this_machines_cpu(node):
    status = node.status.get()
    with open("/proc/cpuinfo") as handle:
        flags = next(line.split(":", 1)[1].strip() for line in handle if line.startswith("flags"))
    assert status["cpuinfo"]["flags"] == flags
    assert status["cpuinfo"]["cpus"] == os.cpu_count()
    assert status["memory"]["total"] > 0
    assert status["pveversion"].startswith("pve-manager/8.")


def test_storage_has_local_and_local_lvm(node):
    storages = {s["storage"]: s for s in node.storage.get()}
    assert storages["local-lvm"]["type"] == "lvmthin"
    assert "images" in storages["local-lvm"]["content"].split(",")
    assert "images" not in storages["local"]["content"].split(",")
    assert [s["storage"] for s in node.storage.get(content="images")] == ["local-lvm"]


def test_cluster_resources_lists_the_template(api, conn):
    entries = api.cluster.resources.get(type="vm")
    assert {e["type"] for e in entries} == {"qemu"}
    template = next(e for e in entries if e["vmid"] == conn["template_vmid"])
    assert template["id"] == "qemu/%d" % conn["template_vmid"]
    assert template["name"] == conn["template_name"]
    assert template["node"] == conn["pve_node"]
    assert (template["template"], template["status"]) == (1, "stopped")


def test_cluster_resources_type_is_verified(http):
    answer = http.api("GET", "/cluster/resources", params={"type": "bogus"})
    assert answer.status_code == 400
    assert answer.json()["errors"] == {
        "type": "value 'bogus' does not have a value in the enumeration 'vm, storage, node, sdn'"}


def test_nextid_is_a_free_id_as_a_string_and_reserves_nothing(api):
    first, second = api.cluster.nextid.get(), api.cluster.nextid.get()
    assert isinstance(first, str) and first == second
    assert int(first) not in {e["vmid"] for e in api.cluster.resources.get(type="vm")}
    assert int(first) >= 100


def test_nextid_with_a_free_vmid_echoes_it(api):
    free = int(api.cluster.nextid.get())
    assert api.cluster.nextid.get(vmid=free) == str(free)


def test_nextid_with_a_taken_vmid_is_400(http, conn):
    answer = http.api("GET", "/cluster/nextid", params={"vmid": conn["template_vmid"]})
    assert (answer.status_code, answer.reason) == (400, "Parameter verification failed.")
    assert answer.json()["errors"] == {"vmid": "VM %d already exists" % conn["template_vmid"]}


def test_nextid_verifies_the_vmid(http):
    answer = http.api("GET", "/cluster/nextid", params={"vmid": 99})
    assert answer.status_code == 400
    assert answer.json()["errors"] == {"vmid": "invalid format - value does not look like a valid VM ID\n"}


def test_another_node_fails_as_pve_proxy_lookup(api):
    try:
        api.nodes("elsewhere").status.get()
    except ResourceException as err:
        assert err.status_code == 500
        assert err.content == ("hostname lookup 'elsewhere' failed - failed to get address info for: elsewhere: "
                               "Name or service not known")
    else:
        raise AssertionError("a node that does not exist answered")


def test_unknown_method_is_501(http):
    answer = http.api("GET", "/nodes/pve/nosuchthing")
    assert (answer.status_code, answer.reason) == (501, "Method 'GET /nodes/pve/nosuchthing' not implemented")
