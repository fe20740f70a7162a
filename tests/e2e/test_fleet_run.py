"""The fleet the inventory declares, in one run each: 16 nodes (4 in `make test`) on 2 fabrics by one add_node run
(one of them made to fail), then converge places 4 declared replicas (2 at 4 nodes); second runs change nothing.

    ansible-playbook -i inventories/lab -i HOSTS.yml -f 16 llmgw.fleet.add_node --limit 'all:!node01:!node02'
    ansible-playbook -i inventories/lab -i HOSTS.yml -f 16 llmgw.fleet.converge --limit 'all:!node01:!node02:!fl-16'

LLMGW_FLEET_NODES sets the width (2 to 16).
The lab is shared: these tests use addresses 10.77.0.140-155 (VMIDs 1140-1155) and VM names fl-*; controller state
lives under the test's directory. Set LLMGW_LAB_KEEP_VMS=1 to keep the VMs for a look afterwards.
"""

import os
import time

import pytest
import yaml
from helpers import REPO, run_playbook, write_destroy_playbook
from onboard_e2e import engine_vars, lab_engine, lab_session, task_results

from ansible_collections.llmgw.fleet.plugins.module_utils.fleet_registry import FleetRegistry

# 16 nodes with `make fleet-scale` (the size, about 10 minutes on 2 cores); `make test` runs 4, the same
# test at a quarter of the width, to keep the suite under its time and the 2-core lab out of overload.
COUNT = int(os.environ.get("LLMGW_FLEET_NODES", "4"))
NODES = {"fl-%02d" % i: ("10.77.0.%d" % (139 + i), "ib-a" if i <= COUNT // 2 else "ib-b") for i in range(1, COUNT + 1)}
BROKEN = "fl-%02d" % COUNT  # onboarded without installing libgomp1, which the lab's template lacks: pending
EVERY_NAME = ["fl-%02d" % i for i in range(1, 17)]  # what a run of any width may have left
# 2 x 4 GPUs each on 8-GPU nodes: 4 nodes (one of them pending) hold 2 such replicas, 8 or more hold 4.
REPLICAS = [{"name": "sim-%d" % i, "model": "sim-coder"} for i in range(1, 5 if COUNT >= 8 else 3)]
LAB_INVENTORY = os.path.join(REPO, "inventories", "lab")
# Not the lab inventory's own fleet group (node01, node02). Exclusions keep the hosts a run adds itself (the
# replicas place_replica launches side by side as llmgw-replica-* hosts); an inclusive --limit would drop them.
LIMIT = "all:!node01:!node02"


class Fleet:
    def __init__(self, root, engine):
        self.root = str(root)
        self.db = os.path.join(self.root, "fleet.db")
        self.hosts = os.path.join(self.root, "hosts.yml")
        children = {}
        for name, (address, fabric) in sorted(NODES.items()):
            group = children.setdefault("fabric_" + fabric.replace("-", "_"),
                                        {"vars": {"fleet_fabric": fabric, "fleet_gpus": 8}, "hosts": {}})
            group["hosts"][name] = {"fleet_address": address + "/24"}
        children["fabric_ib_b"]["hosts"][BROKEN]["install_runtime_deps"] = False
        with open(self.hosts, "w") as handle:
            yaml.safe_dump({"fleet": {"children": children}}, handle)
        self.extra = {"fleet_registry": self.db, "fleet_known_hosts_file": os.path.join(self.root, "known_hosts"),
                      "fleet_ca_dir": os.path.join(self.root, "ca"),
                      "fleet_models": {"sim-coder": {"engine": "sim", "shards": 2, "gpus_per_shard": 4}},
                      "fleet_replicas": REPLICAS}
        self.extra.update(engine_vars(engine))

    def play(self, playbook, limit=LIMIT, check=False):
        started = time.monotonic()
        run = run_playbook("llmgw.fleet." + playbook, self.extra, check=check,
                           inventory=[LAB_INVENTORY, self.hosts], extra_args=["-f", "16", "--limit", limit])
        run.seconds = time.monotonic() - started
        print("  %s --limit %s: %.1f s, rc %d" % (playbook, limit, run.seconds, run.rc))
        return run

    def registry(self):
        with FleetRegistry(self.db) as registry:
            return {n["name"]: n for n in registry.list_nodes()}, {r["name"]: r for r in registry.list_replicas()}


def destroy(fleet):
    path = write_destroy_playbook(os.path.join(fleet.root, "destroy.yml"), EVERY_NAME)
    run_playbook(path, fleet.extra, inventory=LAB_INVENTORY)


def report_lines(run, task):
    (result,) = run.results(task)
    return result["msg"]


def changed_by_host(run):
    return {host: stats["changed"] for host, stats in run.report["stats"].items() if stats["changed"]}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    session = lab_session(vmids=())  # its fl-* VMs are its own to destroy
    lab = session.__next__()
    fleet = Fleet(tmp_path_factory.mktemp("fleet%d" % COUNT), lab_engine())
    fleet.lab = lab
    destroy(fleet)
    try:
        yield fleet
    finally:
        if os.environ.get("LLMGW_LAB_KEEP_VMS") != "1":
            destroy(fleet)
        session.close()


def test_check_mode_predicts_every_node_and_creates_nothing(fleet):
    run = fleet.play("add_node", check=True)
    assert not run.failed, run.failure_messages()
    lines = report_lines(run, "Report the nodes of this run")
    assert len(lines) == 1 + len(NODES)
    assert all(line.split()[1] == "predicted" and "would create the VM" in line for line in lines[1:]), lines
    assert not any(fleet.lab.vm(name) for name in NODES)
    assert not os.path.exists(fleet.db) or not fleet.registry()[0]


def test_a_limit_that_leaves_out_localhost_is_refused_before_any_change(fleet):
    """The lab inventory declares localhost; --limit fl-01 leaves out add_node's controller part (the fleet CA, the
    report), so every node refuses at its first preflight, naming the fix."""
    run = fleet.play("add_node", limit="fl-01")
    assert run.failed
    assert any("--limit 'fabric_ib_a,localhost'" in m for m in run.failure_messages()), run.failure_messages()
    assert not fleet.lab.vm("fl-01")
    assert not os.path.exists(os.path.join(fleet.root, "ca"))


def test_one_run_adds_sixteen_nodes_side_by_side_and_one_failure_stops_no_other(fleet):
    run = fleet.play("add_node")
    lines = report_lines(run, "Report the nodes of this run")
    by_node = {line.split()[0]: line for line in lines[1:]}
    assert sorted(by_node) == sorted(NODES)
    assert run.rc != 0 and any("1 of %d node(s) not ready: %s" % (COUNT, BROKEN) in m for m in run.failure_messages())
    assert by_node[BROKEN].split()[1] == "pending" and "libgomp" in by_node[BROKEN], by_node[BROKEN]
    assert all(by_node[n].split()[1] == "ready" for n in NODES if n != BROKEN), lines
    nodes = fleet.registry()[0]
    assert {n: r["state"] for n, r in nodes.items()} == {n: "pending" if n == BROKEN else "ready" for n in NODES}
    assert {n: (r["address"], r["vmid"], r["fabric"], r["gpu_count"]) for n, r in nodes.items()} == {
        n: (a, 1000 + int(a.rsplit(".", 1)[1]), f, 8) for n, (a, f) in NODES.items()}
    assert sorted(vm["name"] for vm in fleet.lab.client.qemu_vms() if vm["name"] in NODES) == sorted(NODES)
    print("\n".join(lines))


def test_the_second_run_changes_nothing(fleet):
    run = fleet.play("add_node", limit=LIMIT + ":!" + BROKEN)
    assert not run.failed, run.failure_messages()
    assert changed_by_host(run) == {}


def test_converge_places_the_declared_replicas_in_one_run_then_changes_nothing(fleet):
    run = fleet.play("converge", limit=LIMIT + ":!" + BROKEN)
    assert not run.failed, run.failure_messages()
    replicas = fleet.registry()[1]
    assert sorted(replicas) == [r["name"] for r in REPLICAS]
    for replica in replicas.values():
        assert replica["state"] == "ready", replica
        assert len({s["fabric"] for s in replica["shards"]}) == 1 and len(replica["shards"]) == 2
        assert BROKEN not in {s["node"] for s in replica["shards"]}
    lines = report_lines(run, "Report the replicas of this run")
    assert all(" ready on " in line for line in lines[1:]) and len(lines) == 1 + len(REPLICAS), lines
    # Each launch takes its record from its own write in this run (replica_record_known), not from a second read
    # of the registry, and a fresh launch does not read its units' state first (it starts them anyway).
    for task in ("Read the replica from the registry", "Read whether each shard runs"):
        results = task_results(run, task)
        assert len(results) == len(REPLICAS) and all(r.get("skipped") for r in results), (task, results)
    again = fleet.play("converge", limit=LIMIT + ":!" + BROKEN)
    assert not again.failed, again.failure_messages()
    assert changed_by_host(again) == {}
    assert fleet.registry()[1] == replicas
