"""A node's measured speed through the registry's readers: fleet_node records it (check -> apply -> check -> apply),
bin/fleet status shows it, and the inventory plugin exposes it as fleet_speed for groups."""

import json
import os
import sqlite3
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
COLLECTIONS = os.path.join(REPO, ".build", "collections")
BIN = os.path.dirname(sys.executable)
SPEED = {"variant": "haswell", "threads": 8, "vcpus": 8, "pp": 410.5, "tg": 61.0, "baseline_pp": 22.0,
         "baseline_tg": 9.1, "pp_ratio": 18.66, "tg_ratio": 6.7}


def env_for(db):
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=COLLECTIONS, ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
               LLMGW_FLEET_DB=db, ANSIBLE_NOCOLOR="1", ANSIBLE_LOCALHOST_WARNING="0",
               ANSIBLE_INVENTORY_UNPARSED_WARNING="0")
    env.pop("PYTHONPATH", None)  # ansible-test units' PYTHONPATH holds only module_utils; the CLI needs all of it
    return env


def record(db, tmp_path, speed, check=False):
    args = {"name": "node01", "fabric": "ib-a", "status": "ready", "address": "10.77.0.11", "speed": speed,
            "engine_version": "b11434"}
    tasks = [{"name": "node", "llmgw.fleet.fleet_node": args}]
    play = tmp_path / "play.yml"
    play.write_text(json.dumps([{"hosts": "localhost", "gather_facts": False, "tasks": tasks}]))
    argv = [os.path.join(BIN, "ansible-playbook"), str(play), "--diff"] + (["--check"] if check else [])
    proc = subprocess.run(argv, env=env_for(db), capture_output=True, text=True, timeout=300, check=False)
    report = json.loads(proc.stdout)
    return report["plays"][0]["tasks"][0]["hosts"]["localhost"]


def rows(db):
    if not os.path.exists(db):
        return None
    conn = sqlite3.connect(db)
    try:
        return conn.execute("SELECT name, state, speed FROM nodes").fetchall()
    finally:
        conn.close()


def test_a_measured_speed_is_recorded_once_and_shown_by_status_and_the_inventory(tmp_path):
    db = str(tmp_path / "fleet.db")
    predicted = record(db, tmp_path, SPEED, check=True)
    assert predicted["changed"] and predicted["diff"]["after"]["speed"] == SPEED and rows(db) is None
    applied = record(db, tmp_path, SPEED)
    assert applied["changed"] and applied["node"]["speed"] == SPEED
    assert json.loads(rows(db)[0][2]) == SPEED
    assert not record(db, tmp_path, SPEED, check=True)["changed"]
    assert not record(db, tmp_path, SPEED)["changed"]

    slower = dict(SPEED)
    slower.update({"pp": 300.0, "pp_ratio": 13.64})
    before = rows(db)
    assert record(db, tmp_path, slower, check=True)["diff"]["after"]["speed"]["pp"] == 300.0
    assert rows(db) == before, "check mode wrote nothing"
    assert record(db, tmp_path, slower)["node"]["speed"] == slower

    status = subprocess.run([sys.executable, os.path.join(REPO, "bin", "fleet"), "status", "--db", db],
                            env=env_for(db), capture_output=True, text=True, check=True).stdout.splitlines()
    header = next(line for line in status if line.split()[:2] == ["NODE", "STATE"])
    row = next(line for line in status if line.split()[:1] == ["node01"])
    assert "SPEED" in header and row[header.index("ENGINE"):].startswith("b11434 ")
    assert row[header.index("SPEED"):].startswith("haswell pp 300 tg 61 t/s 13.6x x64 8t")

    config = tmp_path / "lab.fleet.yml"
    config.write_text("plugin: llmgw.fleet.fleet\ndb: %s\ngroups:\n  fast: fleet_speed.pp_ratio | default(0) > 10\n"
                      "  slow: fleet_speed.pp_ratio | default(0) < 2\n" % db)
    proc = subprocess.run([os.path.join(BIN, "ansible-inventory"), "-i", str(config), "--list"],
                          env=env_for("/nonexistent"), capture_output=True, text=True, check=True)
    inventory = json.loads(proc.stdout)
    assert inventory["fast"]["hosts"] == ["node01"] and "slow" not in inventory
    assert inventory["_meta"]["hostvars"]["node01"]["fleet_speed"]["tg"] == 61.0


def test_an_unmeasured_node_shows_a_dash_and_clearing_the_speed_is_a_change(tmp_path):
    db = str(tmp_path / "fleet.db")
    record(db, tmp_path, SPEED)
    cleared = record(db, tmp_path, {})
    assert cleared["changed"] and cleared["node"]["speed"] == {}
    status = subprocess.run([sys.executable, os.path.join(REPO, "bin", "fleet"), "status", "--db", db],
                            env=env_for(db), capture_output=True, text=True, check=True).stdout.splitlines()
    header = next(line for line in status if line.split()[:2] == ["NODE", "STATE"])
    row = next(line for line in status if line.split()[:1] == ["node01"])
    assert row[header.index("SPEED"):].split()[0] == "-"
