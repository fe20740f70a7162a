"""A node whose disk cannot hold the model (heavy, `make faults`): the launch is refused before anything is copied or
started, naming the node and its free space; with room, the same playbook places the replica.

One lab node (mf-node01, 10.77.0.226) whose model directory is a 64 KiB tmpfs; the model is the engine role's
76800-byte probe model, declared as a llama.cpp model, and the node runs the lab's llama.cpp build (rolled onto it
with upgrade_engine). The lab is shared: the test keeps its registry under a temporary directory and
destroys its VM at the end (unless LLMGW_LAB_KEEP_VMS=1).
"""

import json
import os
import re

import pytest
from helpers import REPO
from lab_fleet import LabFleet, ok, running, shard_units

NODE = "mf-node01"
MODEL_DIR = "/var/lib/llmgw/models"
PROBE = os.path.join(REPO, "roles", "engine", "files", "llmgw-probe-q4_0.gguf")
MODELS = {"probe": {"engine": "llama.cpp", "shards": 1, "gpus_per_shard": 0, "file": PROBE,
                    "sha256": "180f1e485af961767d74181caf59e1525828d42682d8c8dc6de3fe990ab06977",
                    "options": {"context": 256, "threads": 1}}}

pytestmark = [pytest.mark.heavy,
              pytest.mark.skipif(not os.path.exists(os.path.join(REPO, ".lab", "connection.yml")),
                                 reason="the lab is not up (make lab-up)")]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    with running(LabFleet(tmp_path_factory.mktemp("diskfull"), {NODE: ("10.77.0.226", "ib-a")}, MODELS,
                          gpus=0)) as fleet:
        with open("/var/cache/llmgw-lab/engine/lab.json") as handle:
            lab = json.load(handle)
        ok(fleet.play("upgrade_engine.yml", fleet_engine_version=lab["version"], fleet_engine_archive=lab["archive"],
                      fleet_engine_archive_sha256=lab["sha256"], speed_probe=False))
        fleet.ssh(NODE, "sudo mkdir -p %s && sudo mount -t tmpfs -o size=64k tmpfs %s" % (MODEL_DIR, MODEL_DIR))
        yield fleet


def test_a_full_disk_refuses_the_launch_naming_the_node_and_its_free_space(fleet):
    assert os.path.getsize(PROBE) == 76800
    run = fleet.play("place_replica.yml", replica="probe-a", model="probe")
    assert run.failed
    message = " ".join(str(m) for m in run.failure_messages())
    words = re.compile(r"%s has [0-9.]+ KB free in %s/probe, and the model llmgw-probe-q4_0.gguf needs 75.00 KB: "
                       r"free space there" % (NODE, MODEL_DIR))
    assert words.search(message), message
    replica = fleet.replica("probe-a")
    assert replica["state"] == "failed" and words.search(" ".join(replica["reasons"])), replica
    assert shard_units(fleet, NODE) == []
    assert fleet.ssh(NODE, "ls -A %s/probe" % MODEL_DIR).stdout.split() == []


def test_with_room_the_same_playbook_places_it(fleet):
    fleet.ssh(NODE, "sudo umount %s" % MODEL_DIR)
    ok(fleet.play("place_replica.yml", replica="probe-a", model="probe"))
    assert fleet.replica("probe-a")["state"] == "ready"
    assert shard_units(fleet, NODE) == ["llmgw-shard-probe-a-0.service"]
