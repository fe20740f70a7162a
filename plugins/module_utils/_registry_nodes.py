# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fleet registry's nodes: reads (with free GPUs and the shards each holds) and checked writes.

Private to :mod:`fleet_registry`: :class:`NodeStore` is a part of :class:`fleet_registry.FleetRegistry`.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from ansible_collections.llmgw.fleet.plugins.module_utils._registry_rows import (
    CLEARABLE,
    NODE_FIELDS,
    NODE_STATES,
    RegistryConflict,
    RowStore,
    asked_fields,
    changed_fields,
    node_from_row,
    normalize_timestamp,
    reasons_suffix,
)


class NodeStore(RowStore):
    """Nodes: ``get_node``, ``list_nodes``, ``registered_at``, ``put_node``, ``delete_node``."""

    def _nodes(self, name: Optional[str] = None) -> List[dict]:
        """Nodes (all, or the one named) with their free GPU count and shards: three queries, not one per node."""
        where, args = ("WHERE name = ?", (name,)) if name is not None else ("", ())
        rows = self._conn.execute("SELECT * FROM nodes %s ORDER BY fabric, name" % where, args).fetchall()
        held: Dict[str, int] = {}
        for r in self._conn.execute("SELECT node, COUNT(*) FROM shard_gpus %s GROUP BY node"
                                    % where.replace("name", "node"), args):
            held[r[0]] = r[1]
        shards: Dict[str, List[dict]] = {}
        for r in self._conn.execute("SELECT node, replica, rank FROM shards %s ORDER BY replica, rank"
                                    % where.replace("name", "node"), args):
            shards.setdefault(r["node"], []).append({"replica": r["replica"], "rank": r["rank"]})
        return [node_from_row(row, held.get(row["name"], 0), shards.get(row["name"], [])) for row in rows]

    def get_node(self, name: str) -> Optional[dict]:
        with self.snapshot_read():
            found = self._nodes(name)
        return found[0] if found else None

    def list_nodes(self, fabric: Optional[str] = None, state: Optional[str] = None) -> List[dict]:
        with self.snapshot_read():
            return [n for n in self._nodes()
                    if (fabric is None or n["fabric"] == fabric) and (state is None or n["state"] == state)]

    def registered_at(self) -> Dict[str, str]:
        """When each node was first recorded: reconcile's clock for a node not seen since."""
        with self.snapshot_read():
            return {r[0]: r[1] for r in self._conn.execute("SELECT name, created_at FROM nodes")}

    def put_node(self, name: str, **fields) -> Tuple[Optional[dict], dict]:
        """Create or update a node with the fields given (None leaves a field as it is). Returns (before,
        after). A state change without ``reasons`` clears the old reasons."""
        unknown = set(fields) - set(NODE_FIELDS)
        if unknown:
            raise RegistryConflict("unknown node fields: %s" % ", ".join(sorted(unknown)))
        asked = asked_fields(fields, clearable=[k for k in CLEARABLE if k != "fabric"])
        if "last_seen" in asked:
            asked["last_seen"] = normalize_timestamp(asked["last_seen"])
        if "state" in asked and asked["state"] not in NODE_STATES:
            raise RegistryConflict("node state %r is not one of %s" % (asked["state"], ", ".join(NODE_STATES)))
        with self.transaction():
            before = self.get_node(name)
            if before is None:
                record = {"fabric": "default", "gpu_count": 0, "state": "pending", "reasons": []}
                record.update(asked)
                self._check_node_fields(name, record)
                self._insert_record("nodes", name, record)
                self._event("node", name, "registered", "state %s on fabric %s" % (record["state"], record["fabric"]))
                return None, self.get_node(name)
            changes = changed_fields(before, asked)
            if not changes:
                return before, before
            merged = dict(before, **changes)
            self._check_node_fields(name, merged)
            if "fabric" in changes:
                self._check_fabric_move(name, changes["fabric"])
            if "gpu_count" in changes:
                held = self._conn.execute("SELECT MAX(gpu) FROM shard_gpus WHERE node = ?", (name,)).fetchone()[0]
                if held is not None and held >= changes["gpu_count"]:
                    raise RegistryConflict("node %s: a shard holds GPU %d, so it cannot have %d GPUs"
                                           % (name, held, changes["gpu_count"]))
            self._update("nodes", name, changes)
            if "state" in changes:
                self._event("node", name, "state", "%s -> %s%s" % (
                    before["state"], changes["state"], reasons_suffix(merged["reasons"])))
            return before, self.get_node(name)

    def _check_node_fields(self, name: str, record) -> None:
        if not isinstance(record["fabric"], str) or not record["fabric"]:
            raise RegistryConflict("node %s needs a fabric name" % name)
        if not isinstance(record["gpu_count"], int) or record["gpu_count"] < 0:
            raise RegistryConflict("node %s: gpu_count must be a non-negative integer" % name)
        for key in ("reasons", "engine_args"):
            if not isinstance(record.get(key, []), list):
                raise RegistryConflict("node %s: %s must be a list" % (name, key))
        if not isinstance(record.get("speed", {}), dict):
            raise RegistryConflict("node %s: speed must be a mapping" % name)

    def _check_fabric_move(self, name: str, fabric: str) -> None:
        rows = self._conn.execute(
            "SELECT s.replica FROM shards s JOIN replicas r ON r.name = s.replica "
            "WHERE s.node = ? AND r.shard_count > 1 ORDER BY s.replica", (name,)).fetchall()
        if rows:
            raise RegistryConflict("node %s holds shards of multi-node replicas (%s); moving it to fabric %s would "
                                   "split them across fabrics" % (name, ", ".join(r[0] for r in rows), fabric))

    def delete_node(self, name: str) -> Optional[dict]:
        with self.transaction():
            before = self.get_node(name)
            if before is None:
                return None
            if before["shards"]:
                raise RegistryConflict("node %s still holds shards (%s): repair or remove those replicas first" % (
                    name, ", ".join("%s/%d" % (s["replica"], s["rank"]) for s in before["shards"])))
            self._conn.execute("DELETE FROM nodes WHERE name = ?", (name,))
            self._event("node", name, "removed")
            return before
