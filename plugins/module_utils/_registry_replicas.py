# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fleet registry's replicas and their shards: reads (shards with their GPUs and node) and checked writes.

Private to :mod:`fleet_registry`: :class:`ReplicaStore` is a part of :class:`fleet_registry.FleetRegistry`. The
invariants on shards (exactly the ranks, distinct ready nodes of one fabric, no GPU given twice) are checked here
before a write; the schema refuses a GPU given twice at the database level too.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from ansible_collections.llmgw.fleet.plugins.module_utils._registry_rows import (
    JSON_FIELDS,
    REPLICA_FIELDS,
    REPLICA_JSON_FIELDS,
    REPLICA_STATES,
    SHARD_STATES,
    RegistryConflict,
    RegistryNotFound,
    RowStore,
    asked_fields,
    changed_fields,
    reasons_suffix,
    replica_from_row,
    shard_from_row,
    shard_key,
    shards_words,
    utc_now,
)


class ReplicaStore(RowStore):
    """Replicas: ``get_replica``, ``list_replicas``, ``put_replica``, ``delete_replica``, ``set_shards``,
    ``set_shard_state``."""

    def _replicas(self, name: Optional[str] = None) -> List[dict]:
        """Replicas (all, or the one named) with their shards and GPUs: three queries, not one per shard."""
        where, args = ("WHERE name = ?", (name,)) if name is not None else ("", ())
        rows = self._conn.execute("SELECT * FROM replicas %s ORDER BY name" % where, args).fetchall()
        by_replica = where.replace("name", "s.replica")
        gpus: Dict[Tuple[str, int], List[int]] = {}
        for r in self._conn.execute("SELECT s.replica, s.rank, s.gpu FROM shard_gpus s %s ORDER BY s.gpu"
                                    % by_replica, args):
            gpus.setdefault((r[0], r[1]), []).append(r[2])
        shards: Dict[str, List[dict]] = {}
        for r in self._conn.execute(
                "SELECT s.replica, s.rank, s.node, s.state, s.reasons, n.address, n.fabric, n.engine_args "
                "FROM shards s "
                "JOIN nodes n ON n.name = s.node %s ORDER BY s.replica, s.rank" % by_replica, args):
            shards.setdefault(r["replica"], []).append(shard_from_row(r, gpus.get((r["replica"], r["rank"]), [])))
        return [replica_from_row(row, shards.get(row["name"], [])) for row in rows]

    def get_replica(self, name: str) -> Optional[dict]:
        with self.snapshot_read():
            found = self._replicas(name)
        return found[0] if found else None

    def list_replicas(self) -> List[dict]:
        with self.snapshot_read():
            return self._replicas()

    def put_replica(self, name: str, **fields) -> Tuple[Optional[dict], dict]:
        """Create or update a replica's record (not its shards). Returns (before, after)."""
        unknown = set(fields) - set(REPLICA_FIELDS)
        if unknown:
            raise RegistryConflict("unknown replica fields: %s" % ", ".join(sorted(unknown)))
        asked = asked_fields(fields, clearable=("fabric", "gpu_type"))
        if "avoid_nodes" in asked:
            asked["avoid_nodes"] = sorted(set(asked["avoid_nodes"]))
        if "state" in asked and asked["state"] not in REPLICA_STATES:
            raise RegistryConflict("replica state %r is not one of %s"
                                   % (asked["state"], ", ".join(REPLICA_STATES)))
        with self.transaction():
            before = self.get_replica(name)
            if before is None:
                missing = [k for k in ("model", "engine", "shard_count", "gpus_per_shard") if k not in asked]
                if missing:
                    raise RegistryConflict("a new replica needs %s" % ", ".join(missing))
                record = {"state": "placing", "reasons": [], "avoid_nodes": [], "options": {}}
                record.update(asked)
                self._check_replica_fields(name, record)
                self._insert_record("replicas", name, record)
                self._event("replica", name, "recorded", "%d x %d GPUs, %s %s" % (
                    record["shard_count"], record["gpus_per_shard"], record["engine"], record["model"]))
                return None, self.get_replica(name)
            changes = changed_fields(before, asked)
            if not changes:
                return before, before
            merged = dict(before, **changes)
            self._check_replica_fields(name, merged)
            if before["shards"] and ({"shard_count", "gpus_per_shard"} & set(changes)):
                raise RegistryConflict("replica %s holds shards: remove them before changing its shape" % name)
            if before["shards"] and merged["fabric"] and any(s["fabric"] != merged["fabric"] for s in before["shards"]):
                raise RegistryConflict("replica %s has shards off fabric %s" % (name, merged["fabric"]))
            self._update("replicas", name, changes)
            if "state" in changes:
                self._event("replica", name, "state", "%s -> %s%s" % (
                    before["state"], changes["state"], reasons_suffix(merged["reasons"])))
            return before, self.get_replica(name)

    def _check_replica_fields(self, name: str, record: Mapping) -> None:
        for key in ("shard_count", "gpus_per_shard"):
            if not isinstance(record[key], int) or record[key] < (1 if key == "shard_count" else 0):
                raise RegistryConflict("replica %s: %s must be an integer >= %d"
                                       % (name, key, 1 if key == "shard_count" else 0))
        for key in REPLICA_JSON_FIELDS:
            kind = JSON_FIELDS[key]
            if not isinstance(record.get(key, kind()), kind):
                raise RegistryConflict("replica %s: %s must be a %s" % (name, key, kind.__name__))

    def delete_replica(self, name: str) -> Optional[dict]:
        with self.transaction():
            before = self.get_replica(name)
            if before is None:
                return None
            self._conn.execute("DELETE FROM replicas WHERE name = ?", (name,))
            self._event("replica", name, "removed", shards_words(before["shards"]))
            return before

    def set_shards(self, name: str, shards: Sequence[Mapping]) -> Tuple[dict, dict]:
        """Give a replica exactly its shard count of shards (or none), checking every invariant.

        Each shard is ``{rank, node, gpus}``. A shard already recorded identically keeps its state; any other
        must be on a ready node, within the replica's constraints, on GPUs nobody else holds.
        """
        with self.transaction():
            before = self.get_replica(name)
            if before is None:
                raise RegistryNotFound("no replica %s" % name)
            wanted = [shard_key(s) for s in shards]
            current = {(s["rank"], s["node"], tuple(s["gpus"])): s for s in before["shards"]}
            if sorted(wanted) == sorted(current):
                return before, before
            self._check_shards(before, wanted, current)
            for key in sorted(set(current) - set(wanted)):
                self._conn.execute("DELETE FROM shards WHERE replica = ? AND rank = ?", (name, key[0]))
            for rank, node, gpus in sorted(set(wanted) - set(current)):
                self._conn.execute("INSERT INTO shards (replica, rank, node) VALUES (?, ?, ?)", (name, rank, node))
                for gpu in gpus:
                    try:
                        self._conn.execute("INSERT INTO shard_gpus (node, gpu, replica, rank) VALUES (?, ?, ?, ?)",
                                           (node, gpu, name, rank))
                    except sqlite3.IntegrityError as exc:
                        raise RegistryConflict("GPU %d of %s cannot go to %s rank %d: %s"
                                               % (gpu, node, name, rank, exc))
            self._conn.execute("UPDATE replicas SET updated_at = ? WHERE name = ?", (utc_now(), name))
            after = self.get_replica(name)
            self._event("replica", name, "shards", shards_words(after["shards"]) or "none")
            return before, after

    def _check_shards(self, replica: Mapping, wanted: Sequence[tuple], current: Mapping) -> None:
        name = replica["name"]
        if not wanted:
            return
        ranks = sorted(shard[0] for shard in wanted)
        if ranks != list(range(replica["shard_count"])):
            raise RegistryConflict("replica %s needs exactly ranks 0..%d, got %s"
                                   % (name, replica["shard_count"] - 1, ranks))
        nodes = {}
        for rank, node, gpus in wanted:
            row = self._conn.execute("SELECT * FROM nodes WHERE name = ?", (node,)).fetchone()
            if row is None:
                raise RegistryConflict("replica %s rank %d: no node %s" % (name, rank, node))
            nodes[node] = row
            if len(gpus) != replica["gpus_per_shard"] or len(set(gpus)) != len(gpus):
                raise RegistryConflict("replica %s rank %d: needs %d distinct GPUs, got %s"
                                       % (name, rank, replica["gpus_per_shard"], list(gpus)))
            if any(not 0 <= g < row["gpu_count"] for g in gpus):
                raise RegistryConflict("replica %s rank %d: %s has GPUs 0..%d, not %s"
                                       % (name, rank, node, row["gpu_count"] - 1, list(gpus)))
            if (rank, node, gpus) in current:
                continue
            if row["state"] != "ready":
                raise RegistryConflict("replica %s rank %d: node %s is %s, not ready"
                                       % (name, rank, node, row["state"]))
            if node in replica["avoid_nodes"]:
                raise RegistryConflict("replica %s rank %d: node %s is to be avoided" % (name, rank, node))
            if replica["gpu_type"] and row["gpu_type"] != replica["gpu_type"]:
                raise RegistryConflict("replica %s rank %d: node %s has %s GPUs, not %s"
                                       % (name, rank, node, row["gpu_type"], replica["gpu_type"]))
            for gpu in gpus:
                holder = self._conn.execute("SELECT replica, rank FROM shard_gpus WHERE node = ? AND gpu = ?",
                                            (node, gpu)).fetchone()
                if holder is not None and holder["replica"] != name:
                    raise RegistryConflict("replica %s rank %d: GPU %d of %s is held by %s rank %d"
                                           % (name, rank, gpu, node, holder["replica"], holder["rank"]))
        if len(nodes) != len(wanted):
            raise RegistryConflict("replica %s: two shards on one node" % name)
        fabrics = sorted({row["fabric"] for row in nodes.values()})
        if len(fabrics) > 1:
            raise RegistryConflict("replica %s: shards across fabrics %s" % (name, ", ".join(fabrics)))
        if replica["fabric"] and fabrics != [replica["fabric"]]:
            raise RegistryConflict("replica %s is constrained to fabric %s, not %s"
                                   % (name, replica["fabric"], fabrics[0]))

    def set_shard_state(self, name: str, rank: int, state: str, reasons: Sequence[str] = ()) -> Tuple[dict, dict]:
        if state not in SHARD_STATES:
            raise RegistryConflict("shard state %r is not one of %s" % (state, ", ".join(SHARD_STATES)))
        with self.transaction():
            before = self.get_replica(name)
            if before is None or all(s["rank"] != rank for s in before["shards"]):
                raise RegistryNotFound("no shard %s/%d" % (name, rank))
            self._conn.execute("UPDATE shards SET state = ?, reasons = ? WHERE replica = ? AND rank = ?",
                               (state, json.dumps(list(reasons)), name, rank))
            return before, self.get_replica(name)
