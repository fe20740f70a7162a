# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fleet registry's vocabulary, shared by its parts: the states and fields it stores, its typed errors, how a
row becomes the dict callers get (and a dict a row), and :class:`RowStore`, the base that writes rows and events.

Private to :mod:`fleet_registry` (which re-exports the public names); storage only: nothing here knows the solver.
"""

from __future__ import annotations

import datetime
import json
import sqlite3
from typing import List, Mapping, Optional, Sequence

# The states the schema's CHECK constraints allow (the solver reads the same ones: placement.NODE_STATES, ...).
NODE_STATES = ("pending", "ready", "draining", "maintenance", "lost")
REPLICA_STATES = ("placing", "starting", "ready", "failed")
SHARD_STATES = ("pending", "starting", "active", "failed")

NODE_FIELDS = ("address", "vmid", "proxmox_node", "fabric", "gpu_count", "gpu_type", "cpu_variant",
               "engine_version", "engine_args", "speed", "cert_fingerprint", "state", "reasons", "last_seen")
REPLICA_FIELDS = ("model", "engine", "shard_count", "gpus_per_shard", "fabric", "gpu_type", "avoid_nodes",
                  "port", "options", "state", "reasons")
JSON_FIELDS = {"reasons": list, "avoid_nodes": list, "options": dict, "engine_args": list, "speed": dict}
REPLICA_JSON_FIELDS = ("reasons", "avoid_nodes", "options")
# Text fields a caller may clear by passing "" (None means "leave as it is").
CLEARABLE = ("address", "proxmox_node", "gpu_type", "cpu_variant", "engine_version", "cert_fingerprint", "fabric")


class RegistryError(Exception):
    """Base class of the registry's errors."""


class RegistryNotFound(RegistryError):
    """No database at the path (and the caller asked not to create one), or no such node/replica."""


class RegistrySchemaError(RegistryError):
    """The database was written by a newer collection, or a migration failed (and was rolled back)."""


class RegistryCorrupt(RegistryError):
    """The file is not a registry SQLite can read; it is left exactly as it is."""


class RegistryConflict(RegistryError):
    """The change would break an invariant (a GPU given twice, a replica across fabrics, ...)."""


def not_a_registry(path: str, exc: sqlite3.DatabaseError) -> Exception:
    """For a file SQLite cannot read as a database; an OperationalError (locked, I/O) is passed on as it is."""
    if isinstance(exc, sqlite3.OperationalError):
        return exc
    return RegistryCorrupt("%s is not a fleet registry SQLite can read (%s); it was left as it is: give the right "
                           "path (db, LLMGW_FLEET_DB), or move the file aside and restore a copy" % (path, exc))


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def normalize_timestamp(value: str) -> str:
    """``now`` or an ISO 8601 time, stored as UTC ``YYYY-MM-DDTHH:MM:SSZ``."""
    if value == "now":
        return utc_now()
    try:
        parsed = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise RegistryConflict("%r is not an ISO 8601 time or 'now'" % value)
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=datetime.timezone.utc)
    return parsed.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# -- rows <-> dicts -----------------------------------------------------------------------------------------

def node_from_row(row: Mapping, held: int, shards: Sequence[dict]) -> dict:
    """A node as callers get it: its fields, JSON decoded, its free GPU count and the shards it holds."""
    node = {key: row[key] for key in ("name",) + NODE_FIELDS}
    node["reasons"] = json.loads(node["reasons"])
    node["engine_args"] = json.loads(node["engine_args"])
    node["speed"] = json.loads(node["speed"])
    node["free_gpus"] = node["gpu_count"] - held
    node["shards"] = list(shards)
    return node


def shard_from_row(row: Mapping, gpus: Sequence[int]) -> dict:
    """A shard row joined with its node (address, fabric, engine_args)."""
    return {"rank": row["rank"], "node": row["node"], "gpus": list(gpus), "state": row["state"],
            "reasons": json.loads(row["reasons"]), "address": row["address"], "fabric": row["fabric"],
            "engine_args": json.loads(row["engine_args"])}


def replica_from_row(row: Mapping, shards: Sequence[dict]) -> dict:
    """A replica as callers get it: its fields, JSON decoded, its shards by rank and its leader (rank 0's node)."""
    replica = {key: row[key] for key in ("name",) + REPLICA_FIELDS}
    for key in REPLICA_JSON_FIELDS:
        replica[key] = json.loads(replica[key])
    replica["shards"] = list(shards)
    replica["leader"] = replica["shards"][0]["node"] if replica["shards"] else None
    return replica


def encode(key: str, value):
    return json.dumps(value, sort_keys=True) if key in JSON_FIELDS else value


def asked_fields(fields: Mapping, clearable: Sequence[str]) -> dict:
    """The fields a write asks for: None leaves a field as it is, "" clears a clearable one (stored as NULL)."""
    out = {k: v for k, v in fields.items() if v is not None}
    for key in clearable:
        if out.get(key) == "":
            out[key] = None
    return out


def changed_fields(before: Mapping, asked: Mapping) -> dict:
    """The asked fields that differ from the record; a state change asked without reasons clears the old ones."""
    if "state" in asked and asked["state"] != before["state"] and "reasons" not in asked:
        asked = dict(asked, reasons=[])
    return {k: v for k, v in asked.items() if before[k] != v}


def shard_key(shard: Mapping) -> tuple:
    try:
        return (int(shard["rank"]), str(shard["node"]), tuple(sorted(int(g) for g in shard.get("gpus", ()))))
    except (KeyError, TypeError, ValueError):
        raise RegistryConflict("a shard is {rank, node, gpus}, not %r" % (shard,))


def reasons_suffix(reasons: Sequence[str]) -> str:
    return ": " + "; ".join(reasons) if reasons else ""


def shards_words(shards: Sequence[Mapping]) -> str:
    return " ".join("%d:%s%s" % (s["rank"], s["node"], list(s["gpus"])) for s in shards)


class RowStore:
    """What every part of the registry writes with: rows (an integrity error becomes a RegistryConflict) and
    events (:meth:`events` reads them back). The connection (``_conn``) and ``transaction`` come from
    :class:`fleet_registry.FleetRegistry`."""

    _conn: sqlite3.Connection

    def _event(self, kind: str, subject: str, event: str, detail: str = "") -> None:
        self._conn.execute("INSERT INTO events (at, kind, subject, event, detail) VALUES (?, ?, ?, ?, ?)",
                           (utc_now(), kind, subject, event, detail))

    def events(self, subject: Optional[str] = None, limit: int = 50) -> List[dict]:
        if subject is None:
            rows = self._conn.execute("SELECT * FROM events ORDER BY id DESC LIMIT ?", (limit,))
        else:
            rows = self._conn.execute("SELECT * FROM events WHERE subject = ? ORDER BY id DESC LIMIT ?",
                                      (subject, limit))
        return [dict(r) for r in rows][::-1]

    def _insert(self, table: str, columns: Sequence[str], values: Sequence) -> None:
        try:
            self._conn.execute("INSERT INTO %s (%s) VALUES (%s)" % (table, ", ".join(columns), ", ".join(
                "?" * len(columns))), values)
        except sqlite3.IntegrityError as exc:
            raise RegistryConflict("%s: %s" % (table, exc))

    def _insert_record(self, table: str, name: str, record: Mapping) -> None:
        now = utc_now()
        columns = ["name"] + sorted(record) + ["created_at", "updated_at"]
        values = [name] + [encode(k, record[k]) for k in sorted(record)] + [now, now]
        self._insert(table, columns, values)

    def _update(self, table: str, name: str, changes: Mapping) -> None:
        keys = sorted(changes)
        try:
            self._conn.execute("UPDATE %s SET %s, updated_at = ? WHERE name = ?" % (
                table, ", ".join("%s = ?" % k for k in keys)),
                [encode(k, changes[k]) for k in keys] + [utc_now(), name])
        except sqlite3.IntegrityError as exc:
            raise RegistryConflict("%s %s: %s" % (table, name, exc))
