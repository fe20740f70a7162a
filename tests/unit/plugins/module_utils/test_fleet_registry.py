"""The fleet registry on real SQLite files: schema and migrations, invariants on write, placement and repair in
one transaction, two processes writing at once, and a transaction cut short."""

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time

import pytest

from ansible_collections.llmgw.fleet.plugins.module_utils import fleet_registry, fleet_service
from ansible_collections.llmgw.fleet.plugins.module_utils.fleet_registry import (
    FleetRegistry,
    RegistryConflict,
    RegistryError,
    RegistryNotFound,
    RegistrySchemaError,
)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
COLLECTIONS = os.path.join(REPO, ".build", "collections")


@pytest.fixture
def db(tmp_path):
    return str(tmp_path / "registry" / "fleet.db")


@pytest.fixture
def registry(db):
    with FleetRegistry(db) as reg:
        yield reg


def seed(reg):
    for name, fabric in (("node01", "ib-a"), ("node02", "ib-a"), ("node03", "ib-b"), ("node04", "ib-b")):
        reg.put_node(name, fabric=fabric, gpu_count=8, state="ready", address="10.77.0.1" + name[-1])
    for name, nodes in (("coder-a", ["node01", "node02"]), ("coder-b", ["node03", "node04"])):
        reg.put_replica(name, model="tiny", engine="sim", shard_count=2, gpus_per_shard=4)
        reg.set_shards(name, [{"rank": r, "node": n, "gpus": [0, 1, 2, 3]} for r, n in enumerate(nodes)])


def test_path_option_then_env_then_xdg_then_home(tmp_path):
    env = {"HOME": str(tmp_path)}
    assert fleet_registry.resolve_path("/x/y.db", env) == "/x/y.db"
    assert fleet_registry.resolve_path(None, env) == str(tmp_path / ".local/share/llmgw/fleet.db")
    env["XDG_DATA_HOME"] = "/data"
    assert fleet_registry.resolve_path(None, env) == "/data/llmgw/fleet.db"
    env["LLMGW_FLEET_DB"] = "/env/fleet.db"
    assert fleet_registry.resolve_path(None, env) == "/env/fleet.db"
    assert fleet_registry.resolve_path("/opt.db", env) == "/opt.db"


def test_new_registry_is_wal_with_a_schema_version(registry, db):
    assert os.path.exists(db)
    assert registry.schema_version() == fleet_registry.LATEST_VERSION
    raw = sqlite3.connect(db)
    assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert raw.execute("SELECT version FROM schema_version").fetchall() == [(1,), (2,), (3,), (4,)]
    raw.close()


def test_a_version_1_registry_gains_engine_args_and_keeps_its_nodes(db, monkeypatch):
    monkeypatch.setattr(fleet_registry, "MIGRATIONS", fleet_registry.MIGRATIONS[:1])
    monkeypatch.setattr(fleet_registry, "LATEST_VERSION", 1)
    with FleetRegistry(db) as old:
        old._conn.execute("BEGIN IMMEDIATE")
        old._conn.execute("INSERT INTO nodes (name, fabric, state, created_at, updated_at) "
                          "VALUES ('node01', 'ib-a', 'ready', 'then', 'then')")
        old._conn.execute("COMMIT")
    monkeypatch.undo()
    with FleetRegistry(db) as reg:
        assert reg.schema_version() == fleet_registry.LATEST_VERSION
        node = reg.get_node("node01")
        assert node["state"] == "ready" and node["engine_args"] == []
        _before, after = reg.put_node("node01", engine_args=["--no-repack"])
        assert after["engine_args"] == ["--no-repack"]
        with pytest.raises(RegistryConflict, match="engine_args must be a list"):
            reg.put_node("node01", engine_args="--no-repack")


def test_a_version_2_registry_gains_an_unmeasured_speed_and_records_a_probe(db, monkeypatch):
    monkeypatch.setattr(fleet_registry, "MIGRATIONS", fleet_registry.MIGRATIONS[:2])
    monkeypatch.setattr(fleet_registry, "LATEST_VERSION", 2)
    with FleetRegistry(db) as old:
        old._conn.execute("BEGIN IMMEDIATE")
        old._conn.execute("INSERT INTO nodes (name, fabric, state, engine_args, created_at, updated_at) "
                          "VALUES ('node01', 'ib-a', 'ready', '[\"--no-repack\"]', 'then', 'then')")
        old._conn.execute("COMMIT")
    monkeypatch.undo()
    speed = {"variant": "haswell", "threads": 8, "vcpus": 8, "pp": 410.5, "tg": 61.0,
             "baseline_pp": 22.0, "baseline_tg": 9.1, "pp_ratio": 18.66, "tg_ratio": 6.7}
    with FleetRegistry(db) as reg:
        assert reg.schema_version() == fleet_registry.LATEST_VERSION
        node = reg.get_node("node01")
        assert node["speed"] == {} and node["engine_args"] == ["--no-repack"] and node["state"] == "ready"
        _before, after = reg.put_node("node01", speed=speed)
        assert after["speed"] == speed
        assert reg.put_node("node01", speed=dict(speed))[0] == reg.get_node("node01")  # the same numbers: no change
        with pytest.raises(RegistryConflict, match="speed must be a mapping"):
            reg.put_node("node01", speed=[410.5])


def test_a_version_3_registry_rebuilt_for_maintenance_keeps_nodes_shards_gpus_and_their_guards(db, monkeypatch):
    monkeypatch.setattr(fleet_registry, "MIGRATIONS", fleet_registry.MIGRATIONS[:3])
    monkeypatch.setattr(fleet_registry, "LATEST_VERSION", 3)
    with FleetRegistry(db) as old:
        old.put_node("node01", fabric="ib-a", gpu_count=2, state="ready", speed={"pp_ratio": 9.5})
        old.put_node("node02", fabric="ib-a", gpu_count=2, state="ready")
        old.put_replica("r1", model="m", engine="sim", shard_count=2, gpus_per_shard=1)
        old.set_shards("r1", [{"rank": 0, "node": "node01", "gpus": [1]}, {"rank": 1, "node": "node02", "gpus": [0]}])
        old.put_node("node02", state="draining", reasons=["kernel update"])
        with pytest.raises(RegistryConflict, match="CHECK constraint failed"):  # version 3 has no maintenance
            old.put_node("node01", state="maintenance")
        before = old.snapshot()
    monkeypatch.undo()
    with FleetRegistry(db) as reg:
        assert reg.schema_version() == 4
        after = reg.snapshot()
        assert after["nodes"] == before["nodes"] and after["replicas"] == before["replicas"]
        reg.put_node("node02", state="maintenance")
        assert reg.get_node("node02")["state"] == "maintenance"
        # the guards of version 1 came back with the rebuilt table: GPUs beyond the count, the count below a held GPU,
        # a shard on a node that does not exist
        with pytest.raises(RegistryError):
            reg.put_node("node01", gpu_count=1)
        with pytest.raises(RegistryError):
            reg.set_shards("r1", [{"rank": 0, "node": "node01", "gpus": [5]},
                                  {"rank": 1, "node": "node02", "gpus": [0]}])
        with pytest.raises(RegistryError):
            reg.set_shards("r1", [{"rank": 0, "node": "nowhere", "gpus": []},
                                  {"rank": 1, "node": "node02", "gpus": [0]}])
        assert reg.get_replica("r1")["shards"] == before["replicas"][0]["shards"]
        assert reg._conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1


def test_missing_registry_is_not_created_when_asked_not_to(db):
    with pytest.raises(RegistryNotFound):
        FleetRegistry(db, create=False)
    assert not os.path.exists(db)


def test_migration_upgrades_once_and_a_failed_one_rolls_back(db, monkeypatch):
    FleetRegistry(db).close()
    latest = fleet_registry.LATEST_VERSION
    extra = (latest + 1, "node labels", ("ALTER TABLE nodes ADD COLUMN labels TEXT NOT NULL DEFAULT '{}'",))
    monkeypatch.setattr(fleet_registry, "MIGRATIONS", fleet_registry.MIGRATIONS + (extra,))
    monkeypatch.setattr(fleet_registry, "LATEST_VERSION", latest + 1)
    with FleetRegistry(db) as reg:
        assert reg.schema_version() == latest + 1
    with FleetRegistry(db) as reg:  # opening again applies nothing twice
        assert [r[0] for r in reg._conn.execute("SELECT version FROM schema_version")] == list(range(1, latest + 2))
    broken = (latest + 2, "half a migration", ("CREATE TABLE half (x)", "THIS IS NOT SQL"))
    monkeypatch.setattr(fleet_registry, "MIGRATIONS", fleet_registry.MIGRATIONS + (broken,))
    monkeypatch.setattr(fleet_registry, "LATEST_VERSION", latest + 2)
    with pytest.raises(RegistrySchemaError, match="migration %d" % (latest + 2)):
        FleetRegistry(db)
    raw = sqlite3.connect(db)
    assert raw.execute("SELECT MAX(version) FROM schema_version").fetchone()[0] == latest + 1
    assert raw.execute("SELECT name FROM sqlite_master WHERE name = 'half'").fetchone() is None
    raw.close()


def test_a_newer_schema_is_refused(db):
    FleetRegistry(db).close()
    raw = sqlite3.connect(db)
    raw.execute("INSERT INTO schema_version VALUES (99, 'future', 'then')")
    raw.commit()
    raw.close()
    with pytest.raises(RegistrySchemaError, match="schema version 99"):
        FleetRegistry(db)


def test_put_node_changes_only_what_differs(registry):
    before, after = registry.put_node("node01", fabric="ib-a", gpu_count=8, address="10.77.0.11")
    assert before is None and after["state"] == "pending" and after["free_gpus"] == 8
    again = registry.put_node("node01", fabric="ib-a", gpu_count=8)
    assert again[0] == again[1]
    _ignored, lost = registry.put_node("node01", state="lost", reasons=["unseen for 60 s"],
                                       last_seen="2026-01-02T03:04:05+01:00")
    assert lost["reasons"] == ["unseen for 60 s"] and lost["last_seen"] == "2026-01-02T02:04:05Z"
    _ignored, ready = registry.put_node("node01", state="ready")
    assert ready["reasons"] == [], "a state change without reasons clears the old ones"
    _ignored, cleared = registry.put_node("node01", address="")
    assert cleared["address"] is None
    assert [e["event"] for e in registry.events("node01")] == ["registered", "state", "state"]


def test_invariants_are_checked_on_write(registry):
    seed(registry)
    registry.put_node("node05", fabric="ib-a", gpu_count=8, state="pending")
    registry.put_replica("r", model="m", engine="sim", shard_count=2, gpus_per_shard=2)
    cases = [
        ([{"rank": 0, "node": "node01", "gpus": [4, 5]}], "exactly ranks 0..1"),
        ([{"rank": 0, "node": "node01", "gpus": [4, 5]}, {"rank": 1, "node": "node03", "gpus": [4, 5]}],
         "across fabrics"),
        ([{"rank": 0, "node": "node01", "gpus": [4, 5]}, {"rank": 1, "node": "node05", "gpus": [0, 1]}],
         "node05 is pending, not ready"),
        ([{"rank": 0, "node": "node01", "gpus": [3, 4]}, {"rank": 1, "node": "node02", "gpus": [4, 5]}],
         "GPU 3 of node01 is held by coder-a rank 0"),
        ([{"rank": 0, "node": "node01", "gpus": [7, 8]}, {"rank": 1, "node": "node02", "gpus": [4, 5]}],
         "node01 has GPUs 0..7"),
        ([{"rank": 0, "node": "node01", "gpus": [4]}, {"rank": 1, "node": "node02", "gpus": [4, 5]}],
         "needs 2 distinct GPUs"),
        ([{"rank": 0, "node": "node01", "gpus": [4, 5]}, {"rank": 1, "node": "node01", "gpus": [6, 7]}],
         "two shards on one node"),
    ]
    for shards, message in cases:
        with pytest.raises(RegistryConflict, match=message):
            registry.set_shards("r", shards)
        assert registry.get_replica("r")["shards"] == []
    with pytest.raises(RegistryConflict, match="split them across fabrics"):
        registry.put_node("node01", fabric="ib-b")
    with pytest.raises(RegistryConflict, match="a shard holds GPU 3"):
        registry.put_node("node01", gpu_count=2)
    with pytest.raises(RegistryConflict, match="still holds shards"):
        registry.delete_node("node01")
    with pytest.raises(RegistryConflict, match="remove them before changing its shape"):
        registry.put_replica("coder-a", shard_count=3)


def test_the_database_itself_refuses_a_gpu_given_twice(registry, db):
    seed(registry)
    raw = sqlite3.connect(db)
    raw.execute("PRAGMA foreign_keys = ON")
    raw.execute("INSERT INTO replicas (name, model, engine, shard_count, gpus_per_shard, created_at, updated_at) "
                "VALUES ('sneaky', 'm', 'sim', 1, 1, 'now', 'now')")
    raw.execute("INSERT INTO shards (replica, rank, node) VALUES ('sneaky', 0, 'node01')")
    with pytest.raises(sqlite3.IntegrityError):
        raw.execute("INSERT INTO shard_gpus VALUES ('node01', 0, 'sneaky', 0)")
    with pytest.raises(sqlite3.IntegrityError, match="beyond the node"):
        raw.execute("INSERT INTO shard_gpus VALUES ('node01', 8, 'sneaky', 0)")
    raw.rollback()
    raw.close()


def test_seed_scenario_through_the_registry(registry):
    seed(registry)
    registry.put_node("node02", state="lost", reasons=["unseen for 60 s"])
    fleet = fleet_service.load_fleet(registry)
    assert [r.name for r in fleet.broken_replicas()] == ["coder-a"]
    coder_b = registry.get_replica("coder-b")["shards"]
    decision, before, after = fleet_service.repair(registry, "coder-a")
    assert decision["action"] == "move" and decision["fabric"] == "ib-b"
    assert decision["reaped_shards"] == [{"rank": 0, "node": "node01", "gpus": [0, 1, 2, 3], "address": "10.77.0.11"}]
    assert [(s["node"], s["gpus"]) for s in after["shards"]] == [("node03", [4, 5, 6, 7]), ("node04", [4, 5, 6, 7])]
    assert after["state"] == "placing" and after["reasons"] == ["moved to ib-b after losing node02"]
    assert registry.get_node("node01")["free_gpus"] == 8 and registry.get_node("node01")["shards"] == []
    assert registry.get_replica("coder-b")["shards"] == coder_b, "the healthy replica did not move"
    assert fleet_service.repair(registry, "coder-a")[0]["action"] == "keep"


def test_place_refusal_is_recorded_as_failed_with_the_reason(registry):
    seed(registry)
    registry.put_replica("huge", model="m", engine="sim", shard_count=3, gpus_per_shard=4)
    decision, _ignored, after = fleet_service.place(registry, "huge")
    assert not decision["placed"]
    assert after["state"] == "failed" and "ib-a has 2 of the 3 nodes it needs" in after["reasons"][0]
    assert after["shards"] == []


def test_an_exception_inside_a_transaction_leaves_nothing(registry):
    seed(registry)
    with pytest.raises(RuntimeError), registry.transaction():
        registry.put_replica("half", model="m", engine="sim", shard_count=2, gpus_per_shard=1)
        registry.set_shards("half", [{"rank": 0, "node": "node01", "gpus": [5]},
                                     {"rank": 1, "node": "node02", "gpus": [5]}])
        raise RuntimeError("the playbook was interrupted")
    assert registry.get_replica("half") is None
    assert registry.get_node("node01")["free_gpus"] == 4


def _python(code, *args):
    env = dict(os.environ, PYTHONPATH=COLLECTIONS)
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)] + list(args), env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_killed_writer_leaves_no_half_replica(registry, db, tmp_path):
    seed(registry)
    ready = tmp_path / "inside"
    child = _python("""
        import sys, time
        from ansible_collections.llmgw.fleet.plugins.module_utils.fleet_registry import FleetRegistry
        reg = FleetRegistry(sys.argv[1])
        with reg.transaction():
            reg.put_replica("half", model="m", engine="sim", shard_count=2, gpus_per_shard=2)
            reg.set_shards("half", [{"rank": 0, "node": "node01", "gpus": [4, 5]},
                                    {"rank": 1, "node": "node02", "gpus": [4, 5]}])
            open(sys.argv[2], "w").close()
            time.sleep(60)
    """, db, str(ready))
    deadline = time.monotonic() + 30
    while not ready.exists() and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ready.exists(), child.stderr.read() if child.poll() is not None else "child never got there"
    child.send_signal(signal.SIGKILL)
    child.wait()
    with FleetRegistry(db) as reg:
        assert reg.get_replica("half") is None
        assert reg.get_node("node01")["free_gpus"] == 4
        assert reg._conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        reg.put_replica("after", model="m", engine="sim", shard_count=1, gpus_per_shard=1)  # the lock is free


def test_two_processes_placing_at_once_never_share_a_gpu(registry, db):
    """Two writers each record and place 20 one-GPU replicas on 4 x 8 GPUs: exactly 32 get a GPU, 8 are failed
    with a reason, and no GPU is held twice."""
    for i in range(4):
        registry.put_node("n%d" % i, fabric="ib-a", gpu_count=8, state="ready")
    code = """
        import json, sys
        from ansible_collections.llmgw.fleet.plugins.module_utils import fleet_service
        from ansible_collections.llmgw.fleet.plugins.module_utils.fleet_registry import FleetRegistry
        reg = FleetRegistry(sys.argv[1], busy_timeout=60)
        placed = 0
        for i in range(20):
            name = "%s-%02d" % (sys.argv[2], i)
            reg.put_replica(name, model="m", engine="sim", shard_count=1, gpus_per_shard=1)
            placed += fleet_service.place(reg, name)[0]["placed"]
        print(json.dumps(placed))
    """
    writers = [_python(code, db, who) for who in ("left", "right")]
    results = [w.communicate(timeout=300) for w in writers]
    assert [w.returncode for w in writers] == [0, 0], [r[1] for r in results]
    assert sum(json.loads(out) for out, _ignored in results) == 32
    replicas = registry.list_replicas()
    assert len(replicas) == 40
    held = [(s["node"], g) for r in replicas for s in r["shards"] for g in s["gpus"]]
    assert len(held) == len(set(held)) == 32
    assert sorted(r["state"] for r in replicas).count("failed") == 8


def test_sixteen_writers_at_once_lose_no_write_and_never_see_a_locked_database(registry, db):
    """16 processes each record 25 nodes and update each one once (800 writes, every one its own transaction): no
    "database is locked", every row there with its update, the WAL checkpointed back into the file."""
    code = """
        import sys
        from ansible_collections.llmgw.fleet.plugins.module_utils.fleet_registry import FleetRegistry
        with FleetRegistry(sys.argv[1]) as reg:
            for i in range(25):
                name = "%s-%02d" % (sys.argv[2], i)
                reg.put_node(name, fabric="ib-a", gpu_count=1, state="pending")
                reg.put_node(name, state="ready", last_seen="now")
    """
    writers = [_python(code, db, "w%02d" % n) for n in range(16)]
    results = [w.communicate(timeout=300) for w in writers]
    assert [w.returncode for w in writers] == [0] * 16, [r[1][-500:] for r in results if r[1]]
    assert not [r for r in results if "locked" in r[1]]
    nodes = registry.list_nodes()
    assert len(nodes) == 16 * 25 and {n["state"] for n in nodes} == {"ready"}
    assert all(n["last_seen"] for n in nodes)
    registry._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    raw = sqlite3.connect(db)
    try:
        assert raw.execute("SELECT COUNT(*) FROM nodes WHERE state = 'ready'").fetchone()[0] == 400
    finally:
        raw.close()


def test_an_older_registry_is_backed_up_beside_itself_before_it_is_migrated(db, monkeypatch):
    monkeypatch.setattr(fleet_registry, "MIGRATIONS", fleet_registry.MIGRATIONS[:3])
    monkeypatch.setattr(fleet_registry, "LATEST_VERSION", 3)
    with FleetRegistry(db) as old:
        old.put_node("node01", fabric="ib-a", state="ready")
        kept = old.snapshot()
    monkeypatch.undo()
    with FleetRegistry(db) as reg:
        assert reg.schema_version() == fleet_registry.LATEST_VERSION
    backup = db + ".schema-v3.bak"
    assert os.stat(backup).st_mode & 0o777 == 0o600
    monkeypatch.setattr(fleet_registry, "MIGRATIONS", fleet_registry.MIGRATIONS[:3])
    monkeypatch.setattr(fleet_registry, "LATEST_VERSION", 3)
    with FleetRegistry(backup) as restored:  # the backup is the version-3 registry as it was
        assert restored.schema_version() == 3
        assert restored.snapshot()["nodes"] == kept["nodes"]
    monkeypatch.undo()
    before = os.stat(backup).st_mtime_ns
    with FleetRegistry(db):
        pass
    assert os.stat(backup).st_mtime_ns == before and not os.path.exists(db + ".schema-v4.bak")


def test_fleet_backup_copies_a_registry_in_use_and_the_copy_restores(registry, db, tmp_path):
    seed(registry)
    target = str(tmp_path / "copy.db")
    with registry.transaction():  # a writer holds the lock: the backup still reads a consistent state
        registry.put_node("node09", fabric="ib-b", state="pending")
        proc = subprocess.run([sys.executable, os.path.join(REPO, "bin", "fleet"), "backup", target, "--db", db],
                              capture_output=True, text=True, timeout=60, check=False,
                              env=dict(os.environ, PYTHONPATH=COLLECTIONS))
    assert proc.returncode == 0, proc.stderr
    assert "copied to %s" % target in proc.stdout and os.stat(target).st_mode & 0o777 == 0o600
    with FleetRegistry(target) as copy:
        assert copy.get_node("node09") is None, "the copy holds what was committed when it was taken"
        committed = [n["name"] for n in registry.list_nodes() if n["name"] != "node09"]
        assert [n["name"] for n in copy.list_nodes()] == committed
        assert copy.list_replicas() == registry.list_replicas()


def test_scratch_copy_changes_nothing_on_disk(registry, db):
    seed(registry)
    with FleetRegistry.scratch_copy(db) as scratch:
        scratch.put_node("node01", state="draining")
        scratch.delete_replica("coder-b")
        assert scratch.get_node("node01")["state"] == "draining"
    assert registry.get_node("node01")["state"] == "ready"
    assert registry.get_replica("coder-b") is not None
    with FleetRegistry.scratch_copy(db + ".missing") as empty:
        assert empty.list_nodes() == []
    assert not os.path.exists(db + ".missing")


def test_a_file_that_is_not_a_registry_is_refused_and_left_as_it_is(tmp_path):
    path = tmp_path / "fleet.db"
    path.write_bytes(b"not a registry, perhaps a backup tarball\n" * 100)
    before = path.read_bytes()
    for opened in (lambda: FleetRegistry(str(path)), lambda: FleetRegistry(str(path), create=False),
                   lambda: FleetRegistry.scratch_copy(str(path))):
        with pytest.raises(fleet_registry.RegistryCorrupt, match="is not a fleet registry SQLite can read"):
            opened()
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fleet.db"]  # no -wal, no -shm, no journal


def test_a_new_registry_is_mode_0600_an_older_one_is_tightened_a_foreign_file_is_left_as_found(tmp_path):
    new = tmp_path / "fleet" / "fleet.db"
    with FleetRegistry(str(new)) as registry:
        registry.put_node("n1", fabric="f", gpu_count=0, state="ready", address="10.0.0.1")
    assert oct(os.stat(str(new)).st_mode & 0o777) == "0o600"
    assert all(oct(os.stat(str(p)).st_mode & 0o777) == "0o600" for p in tmp_path.glob("fleet/fleet.db-*"))

    os.chmod(str(new), 0o644)
    with FleetRegistry(str(new), create=False):
        pass
    assert oct(os.stat(str(new)).st_mode & 0o777) == "0o600"

    foreign = tmp_path / "notes.db"
    foreign.write_text("not a registry\n" * 100)
    os.chmod(str(foreign), 0o644)
    with pytest.raises(fleet_registry.RegistryCorrupt):
        FleetRegistry(str(foreign), create=False)
    assert oct(os.stat(str(foreign)).st_mode & 0o777) == "0o644"
