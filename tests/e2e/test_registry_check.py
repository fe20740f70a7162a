"""registry_check.violations finds each broken invariant it names (so that the tests that rely on it can fail)."""

import sqlite3

from registry_check import violations

from ansible_collections.llmgw.fleet.plugins.module_utils.fleet_registry import FleetRegistry


def seeded(path):
    with FleetRegistry(str(path)) as reg:
        for name, fabric in (("n1", "ib-a"), ("n2", "ib-a"), ("n3", "ib-b")):
            reg.put_node(name, fabric=fabric, gpu_count=2, state="ready", address="10.0.0.%s" % name[1])
        reg.put_replica("pair", model="m", engine="sim", shard_count=2, gpus_per_shard=1, port=8001)
        reg.set_shards("pair", [{"rank": 0, "node": "n1", "gpus": [0]}, {"rank": 1, "node": "n2", "gpus": [0]}])
        reg.put_replica("pair", state="ready")
    return str(path)


def corrupt(path, *statements):
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA foreign_keys = OFF")
    for statement in statements:
        conn.execute(statement)
    conn.commit()
    conn.close()


def test_a_consistent_registry_has_none(tmp_path):
    assert violations(seeded(tmp_path / "fleet.db")) == []


def test_each_broken_invariant_is_named(tmp_path):
    path = seeded(tmp_path / "fleet.db")
    corrupt(path, "DELETE FROM shard_gpus WHERE replica = 'pair' AND rank = 1",
            "DELETE FROM shards WHERE replica = 'pair' AND rank = 1",
            "UPDATE nodes SET state = 'lost' WHERE name = 'n1'")
    assert violations(path) == ["replica pair is ready with 1 of its 2 shards",
                                "replica pair is ready with rank 0 on lost node n1"]


def test_a_replica_across_fabrics_and_a_dangling_shard(tmp_path):
    path = seeded(tmp_path / "fleet.db")
    corrupt(path, "UPDATE shards SET node = 'n3' WHERE replica = 'pair' AND rank = 1",
            "UPDATE shard_gpus SET node = 'n3' WHERE replica = 'pair' AND rank = 1",
            "INSERT INTO shards (replica, rank, node) VALUES ('ghost', 0, 'n2')")
    found = violations(path)
    assert "replica pair spans fabrics ['ib-a', 'ib-b']" in found
    assert any(v.startswith("foreign key broken: table shards") for v in found), found
