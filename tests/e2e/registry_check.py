"""Every invariant of a fleet registry, checked on the file as it is (read-only, with sqlite3 rather than through
the collection's own code, so that a bug there cannot hide itself): for the tests that kill or disturb a run.

:func:`violations` returns one sentence per broken invariant; [] for a consistent registry.
"""

import json
import sqlite3

NODE_STATES = {"pending", "ready", "draining", "maintenance", "lost"}
REPLICA_STATES = {"placing", "starting", "ready", "failed"}
SHARD_STATES = {"pending", "starting", "active", "failed"}


def violations(path):
    conn = sqlite3.connect("file:%s?mode=ro" % path, uri=True)
    conn.row_factory = sqlite3.Row
    try:
        return _violations(conn)
    finally:
        conn.close()


def _violations(conn):
    out = []
    integrity = [r[0] for r in conn.execute("PRAGMA integrity_check")]
    if integrity != ["ok"]:
        out.append("integrity_check: %s" % "; ".join(integrity))
    for row in conn.execute("PRAGMA foreign_key_check"):
        out.append("foreign key broken: table %s row %s refers to %s" % (row[0], row[1], row[2]))
    nodes = {r["name"]: r for r in conn.execute("SELECT * FROM nodes")}
    replicas = {r["name"]: r for r in conn.execute("SELECT * FROM replicas")}
    shards = {}
    for r in conn.execute("SELECT * FROM shards ORDER BY replica, rank"):
        shards.setdefault(r["replica"], []).append(r)
    gpus = {}
    for r in conn.execute("SELECT * FROM shard_gpus"):
        gpus.setdefault((r["replica"], r["rank"]), []).append(r["gpu"])
        node = nodes.get(r["node"])
        if node is not None and r["gpu"] >= node["gpu_count"]:
            out.append("%s holds GPU %d of %s, which has %d" % (r["replica"], r["gpu"], r["node"], node["gpu_count"]))
    for name, node in nodes.items():
        if node["state"] not in NODE_STATES:
            out.append("node %s in state %r" % (name, node["state"]))
        if node["state"] == "ready" and not node["address"]:
            out.append("node %s ready without an address" % name)
        json.loads(node["reasons"])
    for name, replica in replicas.items():
        if replica["state"] not in REPLICA_STATES:
            out.append("replica %s in state %r" % (name, replica["state"]))
        own = shards.get(name, [])
        if [s["rank"] for s in own] != list(range(len(own))):
            out.append("replica %s has ranks %s" % (name, [s["rank"] for s in own]))
        if replica["state"] in ("starting", "ready") and len(own) != replica["shard_count"]:
            out.append("replica %s is %s with %d of its %d shards" % (
                name, replica["state"], len(own), replica["shard_count"]))
        fabrics = {nodes[s["node"]]["fabric"] for s in own if s["node"] in nodes}
        if len(fabrics) > 1:
            out.append("replica %s spans fabrics %s" % (name, sorted(fabrics)))
        for shard in own:
            held = gpus.get((name, shard["rank"]), [])
            if len(held) != replica["gpus_per_shard"]:
                out.append("replica %s rank %d holds %d GPUs, not %d" % (
                    name, shard["rank"], len(held), replica["gpus_per_shard"]))
            if shard["state"] not in SHARD_STATES:
                out.append("replica %s rank %d in state %r" % (name, shard["rank"], shard["state"]))
            if replica["state"] == "ready" and nodes.get(shard["node"], {"state": None})["state"] not in (
                    "ready", "draining"):
                out.append("replica %s is ready with rank %d on %s node %s" % (
                    name, shard["rank"], nodes[shard["node"]]["state"], shard["node"]))
    return out
