"""Day two on the lab: upgrade_engine rolls a new llama.cpp build through four nodes under a bounded load.

Four lab nodes on one fabric (up-node01..04, 10.77.0.222-225, two simulated GPUs each) with a 2-shard replica
(``pair``) and a 1-shard one (``solo``) of the simulated engine, served through the test's own gateway. The builds
are the lab's (tests/lab/engine/build.py, b11434) and two made from it by tests/lab/engine/restamp.py: b11435 (the
same binaries, another version stamp) and b11436 (``--ctx-size`` renamed ``--ctx-len``, a flag the launcher
passes). In order (the tests share the fleet):

* the fixture rolls b11434 onto the four nodes, two at a time, which are registered with no engine (the first
  install goes through the same roll), and places the two replicas;
* b11436 is refused on the canary with the flag named, and nothing else is touched: no replica moved, the registry
  as it was, every node's llama.cpp/current as it was, the new files on the canary only;
* ``--check`` names the order and changes nothing;
* b11435 rolls through all four nodes with 2 clients per model sending through the gateway: 0 failed requests;
  every node on b11435 (the registry, llama.cpp/current, the engine's own --version), the old version still there
  to go back to, and the registry, read every 0.2 s during the roll, never had a replica with shards on nodes of two
  engine versions;
* a second run changes nothing, and a node in maintenance is left out of a roll and named;
* a failure mid-roll (b11437, which up-node03 cannot take) stops the roll there: the nodes
  before it on b11437, up-node03 draining and empty on its old engine, up-node04 untouched; a second run, the cause
  removed, carries on.

The lab is shared: these tests use addresses 10.77.0.222-225 and VM names up-*, keep their registry and known_hosts
under a temporary directory, and destroy their VMs at the end (unless LLMGW_LAB_KEEP_VMS=1).
"""

import json
import os
import subprocess
import sys
import threading
import time

import pytest
from gateway_load import Load, failures
from helpers import REPO
from lab_fleet import LabFleet, ok, running

from ansible_collections.llmgw.fleet.plugins.module_utils.fleet_registry import FleetRegistry

NODES = {"up-node0%d" % i: ("10.77.0.%d" % (221 + i), "ib-a") for i in range(1, 5)}
MODELS = {"sim-pair": {"engine": "sim", "shards": 2, "gpus_per_shard": 1},
          "sim-solo": {"engine": "sim", "shards": 1, "gpus_per_shard": 1}}
ENGINES = "/opt/llmgw/engines/llama.cpp"
LAB_BUILD = "/var/cache/llmgw-lab/engine/lab.json"
STATE = {}

# Heavy as a whole (`make faults`): four nodes and two replicas made for it, and a roll under load (about 8 minutes
# beside another file; the suite's 30 minutes cannot hold it).
pytestmark = [pytest.mark.heavy,
              pytest.mark.skipif(not os.path.exists(os.path.join(REPO, ".lab", "connection.yml")),
                                 reason="the lab is not up (make lab-up)")]


def restamp(out_dir, number, *extra):
    out = subprocess.run([sys.executable, os.path.join(REPO, "tests", "lab", "engine", "restamp.py"), str(out_dir),
                          str(number)] + list(extra), capture_output=True, text=True, check=True, timeout=120)
    return json.loads(out.stdout)


def engine_vars(build):
    return {"fleet_engine_version": build["version"], "fleet_engine_archive": build["archive"],
            "fleet_engine_archive_sha256": build["sha256"], "speed_probe": False}


def current_links(fleet):
    return {n: fleet.ssh(n, "readlink %s/current || true" % ENGINES).stdout.strip() for n in sorted(NODES)}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    builds = tmp_path_factory.mktemp("builds")
    with open(LAB_BUILD) as handle:
        lab = json.load(handle)
    STATE["lab"] = {"version": lab["version"], "archive": lab["archive"], "sha256": lab["sha256"]}
    STATE["stamped"] = restamp(builds, 11435)
    STATE["renamed"] = restamp(builds, 11436, "--rename-flag=--ctx-size=--ctx-len")
    with running(LabFleet(tmp_path_factory.mktemp("upgrade"), NODES, MODELS, gpus=2)) as fleet:
        # Two nodes at a time (nothing to move yet): the waves of max_unavailable.
        ok(fleet.play("upgrade_engine.yml", max_unavailable=2, **engine_vars(STATE["lab"])))
        for name, model in (("pair", "sim-pair"), ("solo", "sim-solo")):
            ok(fleet.play("place_replica.yml", replica=name, model=model))
        yield fleet


def test_the_first_roll_installed_the_lab_build_everywhere(fleet):
    assert {n: fleet.node(n)["engine_version"] for n in NODES} == {n: "b11434" for n in NODES}
    assert current_links(fleet) == {n: "%s/b11434" % ENGINES for n in NODES}


def test_a_build_with_a_renamed_flag_is_refused_on_the_canary_and_nothing_else_is_touched(fleet):
    before, links = fleet.snapshot(), current_links(fleet)
    run = fleet.play("upgrade_engine.yml", **engine_vars(STATE["renamed"]))
    assert run.failed
    message = " ".join(str(m) for m in run.failure_messages())
    canary = sorted(NODES)[0]
    assert "b11436 is refused on the canary %s" % canary in message, message
    assert "--ctx-size" in message and "Nothing else was touched" in message, message
    after = fleet.snapshot()
    assert after["nodes"] == before["nodes"] and after["replicas"] == before["replicas"]
    assert current_links(fleet) == links
    staged = {n: fleet.ssh(n, "test -d %s/b11436 && echo yes || echo no" % ENGINES).stdout.strip() for n in NODES}
    assert staged == {n: ("yes" if n == canary else "no") for n in NODES}


def test_check_mode_names_the_order_and_changes_nothing(fleet):
    before, links = fleet.snapshot(), current_links(fleet)
    run = ok(fleet.play("upgrade_engine.yml", check=True, **engine_vars(STATE["stamped"])))
    (shown,) = run.results("Show the roll")
    assert shown["msg"].startswith("4 to b11435: canary up-node01, then up-node02, up-node03, up-node04"), shown
    after = fleet.snapshot()
    assert after["nodes"] == before["nodes"] and after["replicas"] == before["replicas"]
    assert current_links(fleet) == links


class VersionWatch(threading.Thread):
    """Reads the registry every 0.2 s: for each replica with shards, the engine versions of its shards' nodes."""

    def __init__(self, db):
        super().__init__(daemon=True)
        self.db, self.stop_now, self.reads, self.mixed = db, threading.Event(), 0, []

    def run(self):
        while not self.stop_now.is_set():
            with FleetRegistry(self.db) as registry:
                snapshot = registry.snapshot()
            versions = {n["name"]: n["engine_version"] for n in snapshot["nodes"]}
            for replica in snapshot["replicas"]:
                seen = {versions.get(s["node"]) for s in replica["shards"]}
                if len(seen) > 1:
                    self.mixed.append((replica["name"], sorted(s["node"] for s in replica["shards"]), seen))
            self.reads += 1
            time.sleep(0.2)


def drains(run):
    """The fleet_drain results of a run, in order (their task names carry the node)."""
    return [result for play in run.report["plays"] for task in play["tasks"]
            if "Drain | decide where each replica" in task["task"]["name"]
            for result in task["hosts"].values()]


def test_the_roll_under_load_moves_whole_replicas_with_no_failed_request(fleet):
    loads = [Load(fleet.gateway_port, fleet.gateway_key, model, clients=2, total=40000, max_seconds=540, pause=0.02)
             for model in ("sim-pair", "sim-solo")]
    watch = VersionWatch(fleet.db)
    running_loads = [load.start() for load in loads]
    watch.start()
    time.sleep(3)
    started = time.time()
    run = ok(fleet.play("upgrade_engine.yml", **engine_vars(STATE["stamped"])))
    finished = time.time()
    time.sleep(3)
    watch.stop_now.set()
    watch.join(10)
    records = []
    for load in running_loads:
        load.end_now()
        records += load.stop(timeout=90)
    failed = failures(records)
    print("\nroll of b11435 through 4 nodes under load: %d requests from 4 clients (%d during the %.0f s roll), "
          "%d failed; the registry read %d times, %d with a replica on two engine versions"
          % (len(records), len([r for r in records if started <= r["sent"] <= finished]), finished - started,
             len(failed), watch.reads, len(watch.mixed)))
    # The nodes roll in name order, so the nodes before the one drained are on b11435 already.
    order = sorted(NODES)
    moves = [(order.index(d["invocation"]["module_args"]["node"]), m) for d in drains(run) for m in d["moves"]]
    print("moves: " + "; ".join("%s off %s to %s" % (m["replica"], order[i], ",".join(s["node"] for s in m["to"]))
                                for i, m in moves))
    to_new = [m for i, m in moves if all(order.index(s["node"]) < i for s in m["to"])]
    assert not failed, failed[:5]
    assert not watch.mixed, watch.mixed[:5]
    assert to_new, "no replica moved to nodes already on the new version: %s" % moves
    assert watch.reads > 10 and len(records) >= 1000

    assert {n: (fleet.node(n)["engine_version"], fleet.node(n)["state"]) for n in NODES} == {
        n: ("b11435", "ready") for n in NODES}
    assert current_links(fleet) == {n: "%s/b11435" % ENGINES for n in NODES}
    for node in NODES:
        version = fleet.ssh(node, "%s/current/llama-server --version 2>&1" % ENGINES).stdout
        assert "(build 11435," in version, (node, version)
        assert fleet.ssh(node, "test -x %s/b11434/llama-server && echo kept" % ENGINES).stdout.strip() == "kept"
    for name in ("pair", "solo"):
        assert fleet.replica(name)["state"] == "ready", fleet.replica(name)


def test_a_second_roll_changes_nothing(fleet):
    run = ok(fleet.play("upgrade_engine.yml", **engine_vars(STATE["stamped"])))
    assert run.changed == 0
    (shown,) = run.results("Show the roll")
    assert shown["msg"] == "every ready and draining node is on b11435: nothing to do", shown


def test_a_node_in_maintenance_is_left_alone_and_named(fleet):
    empty = sorted(n for n in NODES if not fleet.node(n)["shards"])[0]
    with FleetRegistry(fleet.db) as registry:
        registry.put_node(empty, state="maintenance", reasons=["drained: kernel update"])
    try:
        later = dict(engine_vars(STATE["stamped"]), fleet_engine_version="b11499")
        run = ok(fleet.play("upgrade_engine.yml", check=True, **later))
        (shown,) = run.results("Show the roll")
        rolled = [n for n in sorted(NODES) if n != empty]
        assert shown["msg"] == "3 to b11499: canary %s, then %s, 1 at a time; not rolled: %s (maintenance) (roll " \
            "them once they are ready)" % (rolled[0], ", ".join(rolled[1:]), empty), shown
    finally:
        with FleetRegistry(fleet.db) as registry:
            registry.put_node(empty, state="ready", reasons=[])


def test_a_failure_mid_roll_stops_there_and_a_second_run_carries_on(fleet, tmp_path):
    # b11437, with up-node03 unable to take it: a plain file where its directory goes.
    build = restamp(tmp_path, 11437)
    blocked = "%s/b11437" % ENGINES
    fleet.ssh("up-node03", "sudo touch %s" % blocked)
    run = fleet.play("upgrade_engine.yml", **engine_vars(build))
    assert run.failed
    message = " ".join(str(m) for m in run.failure_messages())
    assert "the roll stopped at up-node03" in message and "points at its old engine" in message, message
    records = {n: fleet.node(n) for n in NODES}
    assert {n: (r["engine_version"], r["state"]) for n, r in records.items()} == {
        "up-node01": ("b11437", "ready"), "up-node02": ("b11437", "ready"),
        "up-node03": ("b11435", "draining"), "up-node04": ("b11435", "ready")}, records
    assert records["up-node03"]["shards"] == []
    assert current_links(fleet) == {"up-node01": "%s/b11437" % ENGINES, "up-node02": "%s/b11437" % ENGINES,
                                    "up-node03": "%s/b11435" % ENGINES, "up-node04": "%s/b11435" % ENGINES}
    for name in ("pair", "solo"):
        assert fleet.replica(name)["state"] == "ready", fleet.replica(name)

    fleet.ssh("up-node03", "sudo rm %s" % blocked)
    ok(fleet.play("upgrade_engine.yml", **engine_vars(build)))
    assert {n: (fleet.node(n)["engine_version"], fleet.node(n)["state"]) for n in NODES} == {
        n: ("b11437", "ready") for n in NODES}
    assert current_links(fleet) == {n: "%s/b11437" % ENGINES for n in NODES}
