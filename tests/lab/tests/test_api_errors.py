"""Error shapes: the message in the reason phrase, `data: null`, parameter errors as 400 with `errors`."""

import pytest

BAD_DNS = "invalid format - value does not look like a valid DNS name\n"


def create(http, conn, **params):
    return http.api("POST", "/nodes/%s/qemu" % conn["pve_node"], data=params)


def test_parameter_error_shape(http, conn):
    answer = create(http, conn, vmid=99)
    assert (answer.status_code, answer.reason) == (400, "Parameter verification failed.")
    body = answer.json()
    assert body["data"] is None
    assert body["errors"] == {"vmid": "invalid format - value does not look like a valid VM ID\n"}


@pytest.mark.parametrize("params, errors", [
    ({"vmid": 5000, "bogus": 1},
     {"bogus": "property is not defined in schema and the schema does not allow additional properties"}),
    ({"vmid": 5000, "cores": "two"}, {"cores": "type check ('integer') failed - got 'two'"}),
    ({"vmid": 5000, "cores": 0}, {"cores": "value must have a minimum value of 1"}),
    ({"vmid": 5000, "name": "not_a_dns_name"}, {"name": BAD_DNS}),
    ({"vmid": 5000, "onboot": "yes"}, {"onboot": "type check ('boolean') failed - got 'yes'"}),
    ({"vmid": 5000, "ostype": "dos"}, {"ostype": "value 'dos' does not have a value in the enumeration "
                                                 "'other, wxp, w2k, w2k3, w2k8, wvista, win7, win8, win10, win11, "
                                                 "l24, l26, solaris'"}),
    ({"name": "novmid"}, {"vmid": "property is missing and it is not optional"}),
    ({"vmid": 1000000000}, {"vmid": "invalid format - value does not look like a valid VM ID\n"}),
    ({"vmid": 5000, "cpu": "pentium9"},
     {"cpu": "invalid format - Built-in cputype 'pentium9' is not defined (missing 'custom-' prefix?)\n"}),
    ({"vmid": 5000, "net0": "bridge=vmbr0"},
     {"net0": "invalid format - format error\nnet0.model: property is missing and it is not optional\n"}),
    ({"vmid": 5000, "ipconfig0": "ip=10.77.0.300/24"},
     {"ipconfig0": "invalid format - format error\nipconfig0.ip: invalid format - value does not look like a valid "
                   "ipv4 network configuration\n\n"}),
])
def test_parameters_are_verified_as_pve_does(http, conn, params, errors):
    answer = create(http, conn, **params)
    assert answer.status_code == 400
    assert answer.json()["errors"] == errors


def test_creating_an_existing_vmid_is_500(http, conn):
    vmid = conn["template_vmid"]
    answer = create(http, conn, vmid=vmid)
    assert answer.status_code == 500
    assert answer.reason == "unable to create VM %d - VM %d already exists on node '%s'" % (vmid, vmid,
                                                                                            conn["pve_node"])
    assert answer.json()["data"] is None


def test_a_missing_vm_is_500_configuration_file_does_not_exist(http, conn, api):
    vmid = int(api.cluster.nextid.get())
    for path in ("/config", "/status/current", ""):
        answer = http.api("GET" if path else "DELETE", "/nodes/%s/qemu/%d%s" % (conn["pve_node"], vmid, path))
        assert answer.status_code == 500
        assert answer.reason == "Configuration file 'nodes/%s/qemu-server/%d.conf' does not exist" % (
            conn["pve_node"], vmid)


def test_the_vmid_in_the_path_is_verified(http, conn):
    answer = http.api("GET", "/nodes/%s/qemu/abc/config" % conn["pve_node"])
    assert answer.status_code == 400
    assert answer.json()["errors"] == {"vmid": "type check ('integer') failed - got 'abc'"}


def test_unknown_storage_is_500_and_storage_without_images_is_400(http, conn, api):
    vmid = int(api.cluster.nextid.get())
    missing = create(http, conn, vmid=vmid, scsi0="nosuch:4")
    assert (missing.status_code, missing.reason) == (500, "storage 'nosuch' does not exist")
    no_images = create(http, conn, vmid=vmid, scsi0="local:4")
    assert no_images.status_code == 400
    assert no_images.json()["errors"] == {"storage": "storage 'local' does not support vm images"}
