# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fleet registry: nodes, replicas and their shards in an embedded SQLite database on the controller.

Where it lives: the ``db`` option of whatever uses it, else ``$LLMGW_FLEET_DB``, else
``$XDG_DATA_HOME/llmgw/fleet.db`` (``~/.local/share/llmgw/fleet.db`` when XDG_DATA_HOME is unset).

Durability and concurrency: WAL journal, foreign keys on, every change in one ``BEGIN IMMEDIATE``
transaction (an interrupted playbook leaves the change out entirely, never half a replica), and a busy
timeout so concurrent playbooks on one controller queue for the write lock instead of failing. Placement
and repair read the fleet, solve and write the answer inside one write transaction, so two playbooks placing
at once cannot hand out the same GPU; the ``shard_gpus`` primary key refuses it at the database level too.

The schema is versioned (``schema_version``); :data:`MIGRATIONS` upgrade an older file when it is opened.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import sqlite3
from typing import Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

from ansible_collections.llmgw.fleet.plugins.module_utils import placement

ENV_VAR = "LLMGW_FLEET_DB"
DEFAULT_BUSY_TIMEOUT = 30.0
SHARD_STATES = ("pending", "starting", "active", "failed")

NODE_FIELDS = ("address", "vmid", "proxmox_node", "fabric", "gpu_count", "gpu_type", "cpu_variant",
               "engine_version", "engine_args", "speed", "cert_fingerprint", "state", "reasons", "last_seen")
REPLICA_FIELDS = ("model", "engine", "shard_count", "gpus_per_shard", "fabric", "gpu_type", "avoid_nodes",
                  "port", "options", "state", "reasons")
_JSON_FIELDS = {"reasons": list, "avoid_nodes": list, "options": dict, "engine_args": list, "speed": dict}
_REPLICA_JSON_FIELDS = ("reasons", "avoid_nodes", "options")
# Text fields a caller may clear by passing "" (None means "leave as it is").
_CLEARABLE = ("address", "proxmox_node", "gpu_type", "cpu_variant", "engine_version", "cert_fingerprint", "fabric")

MIGRATIONS: Tuple[Tuple[int, str, Tuple[str, ...]], ...] = (
    (1, "nodes, replicas, shards, shard GPUs and events", (
        """CREATE TABLE nodes (
            name TEXT PRIMARY KEY,
            address TEXT,
            vmid INTEGER CHECK (vmid IS NULL OR vmid > 0),
            proxmox_node TEXT,
            fabric TEXT NOT NULL CHECK (fabric <> ''),
            gpu_count INTEGER NOT NULL DEFAULT 0 CHECK (gpu_count >= 0),
            gpu_type TEXT,
            cpu_variant TEXT,
            engine_version TEXT,
            cert_fingerprint TEXT,
            state TEXT NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'ready', 'draining', 'lost')),
            reasons TEXT NOT NULL DEFAULT '[]',
            last_seen TEXT,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL
        )""",
        """CREATE TABLE replicas (
            name TEXT PRIMARY KEY,
            model TEXT NOT NULL,
            engine TEXT NOT NULL,
            shard_count INTEGER NOT NULL CHECK (shard_count >= 1),
            gpus_per_shard INTEGER NOT NULL CHECK (gpus_per_shard >= 0),
            fabric TEXT,
            gpu_type TEXT,
            avoid_nodes TEXT NOT NULL DEFAULT '[]',
            port INTEGER CHECK (port IS NULL OR port BETWEEN 1 AND 65535),
            options TEXT NOT NULL DEFAULT '{}',
            state TEXT NOT NULL DEFAULT 'placing' CHECK (state IN ('placing', 'starting', 'ready', 'failed')),
            reasons TEXT NOT NULL DEFAULT '[]',
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL
        )""",
        """CREATE TABLE shards (
            replica TEXT NOT NULL REFERENCES replicas (name) ON DELETE CASCADE,
            rank INTEGER NOT NULL CHECK (rank >= 0),
            node TEXT NOT NULL REFERENCES nodes (name),
            state TEXT NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'starting', 'active', 'failed')),
            reasons TEXT NOT NULL DEFAULT '[]',
            PRIMARY KEY (replica, rank),
            UNIQUE (replica, node),
            UNIQUE (replica, rank, node)
        )""",
        "CREATE INDEX shards_by_node ON shards (node)",
        # One row per GPU a shard holds; the primary key is "no GPU given twice".
        """CREATE TABLE shard_gpus (
            node TEXT NOT NULL,
            gpu INTEGER NOT NULL CHECK (gpu >= 0),
            replica TEXT NOT NULL,
            rank INTEGER NOT NULL,
            PRIMARY KEY (node, gpu),
            FOREIGN KEY (replica, rank, node) REFERENCES shards (replica, rank, node) ON DELETE CASCADE
        )""",
        """CREATE TRIGGER shard_gpus_exist BEFORE INSERT ON shard_gpus
            WHEN NEW.gpu >= (SELECT gpu_count FROM nodes WHERE name = NEW.node)
            BEGIN SELECT RAISE(ABORT, 'GPU index beyond the node''s GPU count'); END""",
        """CREATE TRIGGER nodes_keep_held_gpus BEFORE UPDATE OF gpu_count ON nodes
            WHEN EXISTS (SELECT 1 FROM shard_gpus WHERE node = NEW.name AND gpu >= NEW.gpu_count)
            BEGIN SELECT RAISE(ABORT, 'a shard holds a GPU beyond the new GPU count'); END""",
        """CREATE TABLE events (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            at TEXT NOT NULL,
            kind TEXT NOT NULL CHECK (kind IN ('node', 'replica')),
            subject TEXT NOT NULL,
            event TEXT NOT NULL,
            detail TEXT NOT NULL DEFAULT ''
        )""",
        "CREATE INDEX events_by_subject ON events (kind, subject, id)",
    )),
    # Arguments every llama-server on the node gets, found at onboarding (--no-repack where AMX faults).
    (2, "nodes.engine_args", (
        "ALTER TABLE nodes ADD COLUMN engine_args TEXT NOT NULL DEFAULT '[]'",
    )),
    # The speed probe's numbers: llama-bench with the picked CPU backend and with the scalar x64 one, their ratios,
    # the variant and threads ({} until measured).
    (3, "nodes.speed", (
        "ALTER TABLE nodes ADD COLUMN speed TEXT NOT NULL DEFAULT '{}'",
    )),
)
LATEST_VERSION = MIGRATIONS[-1][0]


class RegistryError(Exception):
    """Base class of the registry's errors."""


class RegistryNotFound(RegistryError):
    """No database at the path (and the caller asked not to create one), or no such node/replica."""


class RegistrySchemaError(RegistryError):
    """The database was written by a newer collection, or a migration failed (and was rolled back)."""


class RegistryCorrupt(RegistryError):
    """The file is not a registry SQLite can read; it is left exactly as it is."""


def not_a_registry(path: str, exc: sqlite3.DatabaseError) -> Exception:
    """For a file SQLite cannot read as a database; an OperationalError (locked, I/O) is passed on as it is."""
    if isinstance(exc, sqlite3.OperationalError):
        return exc
    return RegistryCorrupt("%s is not a fleet registry SQLite can read (%s); it was left as it is: give the right "
                           "path (db, LLMGW_FLEET_DB), or move the file aside and restore a copy" % (path, exc))


class RegistryConflict(RegistryError):
    """The change would break an invariant (a GPU given twice, a replica across fabrics, ...)."""


def default_path(environ: Optional[Mapping[str, str]] = None) -> str:
    environ = os.environ if environ is None else environ
    if environ.get(ENV_VAR):
        return os.path.expanduser(environ[ENV_VAR])
    home = environ.get("HOME") or os.path.expanduser("~")
    data_home = environ.get("XDG_DATA_HOME") or os.path.join(home, ".local", "share")
    return os.path.join(data_home, "llmgw", "fleet.db")


def resolve_path(path: Optional[str] = None, environ: Optional[Mapping[str, str]] = None) -> str:
    """The option wins, then LLMGW_FLEET_DB, then the XDG default."""
    return os.path.abspath(os.path.expanduser(path)) if path else os.path.abspath(default_path(environ))


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


def create_private(path: str) -> None:
    """Create an empty ``path`` mode 0600: the registry holds the fleet's addresses and certificate fingerprints,
    and SQLite gives its -wal and -shm files the mode of the database."""
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))


def make_private(path: str) -> None:
    """Take group and other access off a registry this user owns (one made before registries were created 0600)."""
    info = os.stat(path)
    if info.st_uid == os.getuid() and info.st_mode & 0o077:
        os.chmod(path, info.st_mode & 0o700)


def _connect(target: str, busy_timeout: float) -> sqlite3.Connection:
    conn = sqlite3.connect(target, timeout=busy_timeout, isolation_level=None)
    conn.row_factory = sqlite3.Row
    conn.execute("PRAGMA busy_timeout = %d" % int(busy_timeout * 1000))
    conn.execute("PRAGMA foreign_keys = ON")
    return conn


class FleetRegistry:
    """One connection to the registry. Use as a context manager, or call :meth:`close`."""

    def __init__(self, path: Optional[str] = None, busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
                 create: bool = True, _conn: Optional[sqlite3.Connection] = None):
        self._depth = 0
        if _conn is not None:
            self.path = path or ":memory:"
            self._conn = _conn
        else:
            self.path = resolve_path(path)
            if not os.path.exists(self.path):
                if not create:
                    raise RegistryNotFound("no fleet registry at %s" % self.path)
                os.makedirs(os.path.dirname(self.path), mode=0o700, exist_ok=True)
                create_private(self.path)
            self._conn = _connect(self.path, busy_timeout)
            try:
                self._conn.execute("PRAGMA journal_mode = WAL")
                self._conn.execute("PRAGMA synchronous = FULL")
            except sqlite3.DatabaseError as exc:
                self._conn.close()
                raise not_a_registry(self.path, exc) from exc
        try:
            self._migrate()
        except sqlite3.DatabaseError as exc:
            self._conn.close()
            raise not_a_registry(self.path, exc) from exc
        if _conn is None:
            make_private(self.path)  # only once it is known to be a registry: a refused file is left as found

    @classmethod
    def scratch_copy(cls, path: Optional[str] = None) -> FleetRegistry:
        """An in-memory copy of the registry (empty if there is none): what check mode writes to."""
        resolved = resolve_path(path)
        memory = _connect(":memory:", DEFAULT_BUSY_TIMEOUT)
        if os.path.exists(resolved):
            source = _connect(resolved, DEFAULT_BUSY_TIMEOUT)
            try:
                source.backup(memory)
            except sqlite3.DatabaseError as exc:
                memory.close()
                raise not_a_registry(resolved, exc) from exc
            finally:
                source.close()
        return cls(resolved, _conn=memory)

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> FleetRegistry:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- schema -------------------------------------------------------------------------------------------

    def schema_version(self) -> int:
        exists = self._conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'").fetchone()
        if not exists:
            return 0
        return self._conn.execute("SELECT COALESCE(MAX(version), 0) FROM schema_version").fetchone()[0]

    def _migrate(self) -> None:
        if self.schema_version() == LATEST_VERSION:
            return
        with self.transaction():
            current = self.schema_version()  # again, now that we hold the write lock
            if current > LATEST_VERSION:
                raise RegistrySchemaError(
                    "%s has schema version %d; this collection knows up to %d: upgrade the collection"
                    % (self.path, current, LATEST_VERSION))
            self._conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_version ("
                "version INTEGER PRIMARY KEY, description TEXT NOT NULL, applied_at TEXT NOT NULL)")
            for version, description, statements in MIGRATIONS:
                if version <= current:
                    continue
                try:
                    for statement in statements:
                        self._conn.execute(statement)
                except sqlite3.Error as exc:
                    raise RegistrySchemaError("migration %d (%s) failed: %s" % (version, description, exc))
                self._conn.execute("INSERT INTO schema_version VALUES (?, ?, ?)", (version, description, utc_now()))

    # -- transactions -------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """A write transaction (BEGIN IMMEDIATE); nested calls join the outermost one."""
        if self._depth:
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
            return
        self._conn.execute("BEGIN IMMEDIATE")
        self._depth = 1
        try:
            yield
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        else:
            self._conn.execute("COMMIT")
        finally:
            self._depth = 0

    @contextlib.contextmanager
    def snapshot_read(self) -> Iterator[None]:
        """A read transaction: several SELECTs see one consistent state (WAL snapshot)."""
        if self._depth:
            yield
            return
        self._conn.execute("BEGIN DEFERRED")
        self._depth = 1
        try:
            yield
        finally:
            self._depth = 0
            self._conn.execute("COMMIT")

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

    # -- nodes --------------------------------------------------------------------------------------------

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
        nodes = []
        for row in rows:
            node = {key: row[key] for key in ("name",) + NODE_FIELDS}
            node["reasons"] = json.loads(node["reasons"])
            node["engine_args"] = json.loads(node["engine_args"])
            node["speed"] = json.loads(node["speed"])
            node["free_gpus"] = node["gpu_count"] - held.get(row["name"], 0)
            node["shards"] = shards.get(row["name"], [])
            nodes.append(node)
        return nodes

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
        wanted = _wanted(fields, clearable=[k for k in _CLEARABLE if k != "fabric"])
        if "last_seen" in wanted:
            wanted["last_seen"] = normalize_timestamp(wanted["last_seen"])
        if "state" in wanted and wanted["state"] not in placement.NODE_STATES:
            raise RegistryConflict("node state %r is not one of %s"
                                   % (wanted["state"], ", ".join(placement.NODE_STATES)))
        with self.transaction():
            before = self.get_node(name)
            if before is None:
                record = {"fabric": "default", "gpu_count": 0, "state": "pending", "reasons": []}
                record.update(wanted)
                self._check_node_fields(name, record)
                now = utc_now()
                columns = ["name"] + sorted(record) + ["created_at", "updated_at"]
                values = [name] + [_encode(k, record[k]) for k in sorted(record)] + [now, now]
                self._insert("nodes", columns, values)
                self._event("node", name, "registered", "state %s on fabric %s" % (record["state"], record["fabric"]))
                return None, self.get_node(name)
            if "state" in wanted and wanted["state"] != before["state"] and "reasons" not in wanted:
                wanted["reasons"] = []
            changes = {k: v for k, v in wanted.items() if before[k] != v}
            if not changes:
                return before, before
            merged = dict(before)
            merged.update(changes)
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
                    before["state"], changes["state"], _reasons_suffix(merged["reasons"])))
            return before, self.get_node(name)

    def _check_node_fields(self, name: str, record: Mapping) -> None:
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

    # -- replicas -----------------------------------------------------------------------------------------

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
            shards.setdefault(r["replica"], []).append({
                "rank": r["rank"], "node": r["node"], "gpus": gpus.get((r["replica"], r["rank"]), []),
                "state": r["state"], "reasons": json.loads(r["reasons"]), "address": r["address"],
                "fabric": r["fabric"], "engine_args": json.loads(r["engine_args"])})
        replicas = []
        for row in rows:
            replica = {key: row[key] for key in ("name",) + REPLICA_FIELDS}
            for key in _REPLICA_JSON_FIELDS:
                replica[key] = json.loads(replica[key])
            replica["shards"] = shards.get(row["name"], [])
            replica["leader"] = replica["shards"][0]["node"] if replica["shards"] else None
            replicas.append(replica)
        return replicas

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
        wanted = _wanted(fields, clearable=("fabric", "gpu_type"))
        if "avoid_nodes" in wanted:
            wanted["avoid_nodes"] = sorted(set(wanted["avoid_nodes"]))
        if "state" in wanted and wanted["state"] not in placement.REPLICA_STATES:
            raise RegistryConflict("replica state %r is not one of %s"
                                   % (wanted["state"], ", ".join(placement.REPLICA_STATES)))
        with self.transaction():
            before = self.get_replica(name)
            if before is None:
                missing = [k for k in ("model", "engine", "shard_count", "gpus_per_shard") if k not in wanted]
                if missing:
                    raise RegistryConflict("a new replica needs %s" % ", ".join(missing))
                record = {"state": "placing", "reasons": [], "avoid_nodes": [], "options": {}}
                record.update(wanted)
                self._check_replica_fields(name, record)
                now = utc_now()
                columns = ["name"] + sorted(record) + ["created_at", "updated_at"]
                values = [name] + [_encode(k, record[k]) for k in sorted(record)] + [now, now]
                self._insert("replicas", columns, values)
                self._event("replica", name, "recorded", "%d x %d GPUs, %s %s" % (
                    record["shard_count"], record["gpus_per_shard"], record["engine"], record["model"]))
                return None, self.get_replica(name)
            if "state" in wanted and wanted["state"] != before["state"] and "reasons" not in wanted:
                wanted["reasons"] = []
            changes = {k: v for k, v in wanted.items() if before[k] != v}
            if not changes:
                return before, before
            merged = dict(before)
            merged.update(changes)
            self._check_replica_fields(name, merged)
            if before["shards"] and ({"shard_count", "gpus_per_shard"} & set(changes)):
                raise RegistryConflict("replica %s holds shards: remove them before changing its shape" % name)
            if before["shards"] and merged["fabric"] and any(s["fabric"] != merged["fabric"] for s in before["shards"]):
                raise RegistryConflict("replica %s has shards off fabric %s" % (name, merged["fabric"]))
            self._update("replicas", name, changes)
            if "state" in changes:
                self._event("replica", name, "state", "%s -> %s%s" % (
                    before["state"], changes["state"], _reasons_suffix(merged["reasons"])))
            return before, self.get_replica(name)

    def _check_replica_fields(self, name: str, record: Mapping) -> None:
        for key in ("shard_count", "gpus_per_shard"):
            if not isinstance(record[key], int) or record[key] < (1 if key == "shard_count" else 0):
                raise RegistryConflict("replica %s: %s must be an integer >= %d"
                                       % (name, key, 1 if key == "shard_count" else 0))
        for key in _REPLICA_JSON_FIELDS:
            kind = _JSON_FIELDS[key]
            if not isinstance(record.get(key, kind()), kind):
                raise RegistryConflict("replica %s: %s must be a %s" % (name, key, kind.__name__))

    def delete_replica(self, name: str) -> Optional[dict]:
        with self.transaction():
            before = self.get_replica(name)
            if before is None:
                return None
            self._conn.execute("DELETE FROM replicas WHERE name = ?", (name,))
            self._event("replica", name, "removed", _shards_words(before["shards"]))
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
            wanted = [_shard_key(s) for s in shards]
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
            self._event("replica", name, "shards", _shards_words(after["shards"]) or "none")
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

    # -- the solver, inside one write transaction --------------------------------------------------------

    def load_fleet(self) -> placement.Fleet:
        with self.snapshot_read():
            nodes = [placement.Node(name=r["name"], fabric=r["fabric"], gpus=r["gpu_count"], state=r["state"],
                                    gpu_type=r["gpu_type"])
                     for r in self._conn.execute("SELECT name, fabric, gpu_count, state, gpu_type FROM nodes")]
            replicas = [to_solver_replica(r) for r in self._replicas()]
        return placement.Fleet(nodes, replicas)

    def place(self, name: str) -> Tuple[dict, dict, dict]:
        """Place a recorded replica that holds no shards. Returns (decision, before, after); a refusal
        records the replica as failed with the reason."""
        with self.transaction():
            before = self.get_replica(name)
            if before is None:
                raise RegistryNotFound("no replica %s" % name)
            if before["shards"]:
                raise RegistryConflict("replica %s already holds shards; repair it instead" % name)
            fleet = self.load_fleet()
            request = fleet.replicas[name].as_request()
            others = placement.Fleet(fleet.nodes.values(), [r for r in fleet.replicas.values() if r.name != name])
            decision = placement.place(others, request)
            self._record(before, decision)
            return decision.to_dict(), before, self.get_replica(name)

    def repair(self, name: str) -> Tuple[dict, dict, dict]:
        """Repair a replica after a node loss; reaped survivors are removed here and returned (with their
        node addresses) in ``decision['reaped_shards']``: the caller must stop them."""
        with self.transaction():
            before = self.get_replica(name)
            if before is None:
                raise RegistryNotFound("no replica %s" % name)
            decision = placement.repair(self.load_fleet(), name)
            self._record(before, decision)
            out = decision.to_dict()
            addresses = {s["node"]: s["address"] for s in before["shards"]}
            for shard in out["reaped_shards"]:
                shard["address"] = addresses.get(shard["node"])
            return out, before, self.get_replica(name)

    def _record(self, before: Mapping, decision) -> None:
        name = before["name"]
        if decision.placed and decision.action == "keep":
            return
        if not decision.placed:
            self.set_shards(name, [])
            self.put_replica(name, state="failed", reasons=[decision.reason])
            return
        states = {s["node"]: (self.get_node(s["node"]) or {}).get("state") for s in before["shards"]}
        self.set_shards(name, [s.to_dict() for s in decision.shards])
        lost = ", ".join(sorted(n for n, state in states.items() if state not in placement.LIVE_NODE_STATES))
        # placement.broken_reason is the one definition of what made it need this (failed, a shard not live, ...)
        cause = "after losing %s" % lost if lost else "(%s)" % placement.broken_reason(
            before["shard_count"], [(s["rank"], s["node"]) for s in before["shards"]], states, before["state"])
        why = {"place": "placed on %s" % decision.fabric,
               "repair": "repaired on %s %s" % (decision.fabric, cause),
               "move": "moved to %s %s" % (decision.fabric, cause)}[decision.action]
        self.put_replica(name, state="placing", reasons=[why])

    def snapshot(self) -> dict:
        """Everything a reader needs at one instant: nodes, replicas, per-fabric totals."""
        with self.snapshot_read():
            nodes = self.list_nodes()
            replicas = self.list_replicas()
        fabrics: Dict[str, dict] = {}
        for node in nodes:
            entry = fabrics.setdefault(node["fabric"], {"nodes": 0, "ready_nodes": 0, "gpus": 0, "free_gpus": 0,
                                                        "largest_free": 0})
            entry["nodes"] += 1
            if node["state"] == "ready":
                entry["ready_nodes"] += 1
                entry["gpus"] += node["gpu_count"]
                entry["free_gpus"] += node["free_gpus"]
                entry["largest_free"] = max(entry["largest_free"], node["free_gpus"])
        return {"path": self.path, "schema_version": self.schema_version(), "nodes": nodes, "replicas": replicas,
                "fabrics": fabrics}

    # -- helpers ------------------------------------------------------------------------------------------

    def _insert(self, table: str, columns: Sequence[str], values: Sequence) -> None:
        try:
            self._conn.execute("INSERT INTO %s (%s) VALUES (%s)" % (table, ", ".join(columns), ", ".join(
                "?" * len(columns))), values)
        except sqlite3.IntegrityError as exc:
            raise RegistryConflict("%s: %s" % (table, exc))

    def _update(self, table: str, name: str, changes: Mapping) -> None:
        keys = sorted(changes)
        try:
            self._conn.execute("UPDATE %s SET %s, updated_at = ? WHERE name = ?" % (
                table, ", ".join("%s = ?" % k for k in keys)),
                [_encode(k, changes[k]) for k in keys] + [utc_now(), name])
        except sqlite3.IntegrityError as exc:
            raise RegistryConflict("%s %s: %s" % (table, name, exc))


def to_solver_replica(replica: Mapping) -> placement.Replica:
    return placement.Replica(
        name=replica["name"], shard_count=replica["shard_count"], gpus_per_shard=replica["gpus_per_shard"],
        shards=tuple(placement.Shard(s["rank"], s["node"], tuple(s["gpus"])) for s in replica["shards"]),
        state=replica["state"], engine=replica["engine"], model=replica["model"], fabric=replica["fabric"],
        avoid_nodes=frozenset(replica["avoid_nodes"]), gpu_type=replica["gpu_type"],
    )


def comparable(record: Optional[Mapping], fields: Sequence[str]) -> Optional[dict]:
    """The part of a node or replica that a module's ``changed`` and diff are about."""
    if record is None:
        return None
    out = {k: record[k] for k in ("name",) + tuple(fields)}
    if "shards" in record and "model" in fields:
        out["shards"] = [{"rank": s["rank"], "node": s["node"], "gpus": s["gpus"], "state": s["state"]}
                         for s in record["shards"]]
    return out


def _wanted(fields: Mapping, clearable: Sequence[str]) -> dict:
    wanted = {k: v for k, v in fields.items() if v is not None}
    for key in clearable:
        if wanted.get(key) == "":
            wanted[key] = None
    return wanted


def open_for_module(path: Optional[str], check_mode: bool) -> FleetRegistry:
    """The registry itself, or in check mode an in-memory copy, so check mode runs the very same checks."""
    return FleetRegistry.scratch_copy(path) if check_mode else FleetRegistry(path)


def _shard_key(shard: Mapping) -> tuple:
    try:
        return (int(shard["rank"]), str(shard["node"]), tuple(sorted(int(g) for g in shard.get("gpus", ()))))
    except (KeyError, TypeError, ValueError):
        raise RegistryConflict("a shard is {rank, node, gpus}, not %r" % (shard,))


def _encode(key: str, value):
    return json.dumps(value, sort_keys=True) if key in _JSON_FIELDS else value


def _reasons_suffix(reasons: Sequence[str]) -> str:
    return ": " + "; ".join(reasons) if reasons else ""


def _shards_words(shards: Sequence[Mapping]) -> str:
    return " ".join("%d:%s%s" % (s["rank"], s["node"], list(s["gpus"])) for s in shards)
