# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fleet registry's schema: :data:`MIGRATIONS` (every version's SQL, in order), the version a file holds, and
the migration procedure (an older file backed up beside itself first, then every missing migration in one write
transaction, foreign keys checked before it commits).

Private to :mod:`fleet_registry` (which re-exports the public names): :class:`SchemaStore` is a part of
:class:`fleet_registry.FleetRegistry`. It does I/O: SQLite, through the registry's connection, and the backup file
(through ``FleetRegistry.backup``).
"""

from __future__ import annotations

import os
import sqlite3
from typing import Tuple

from ansible_collections.llmgw.fleet.plugins.module_utils._registry_rows import RegistrySchemaError, utc_now

Migrations = Tuple[Tuple[int, str, Tuple[str, ...]], ...]

MIGRATIONS: Migrations = (
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
    # A node drained empty for maintenance (drain_node): a new allowed state. SQLite cannot change a CHECK in place,
    # so the table is rebuilt (https://www.sqlite.org/lang_altertable.html, "other kinds of table schema changes");
    # _migrate runs migrations with foreign keys off and checks them before it commits.
    (4, "nodes.state maintenance", (
        "DROP TRIGGER shard_gpus_exist",
        "DROP TRIGGER nodes_keep_held_gpus",
        """CREATE TABLE nodes_new (
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
            state TEXT NOT NULL DEFAULT 'pending'
                CHECK (state IN ('pending', 'ready', 'draining', 'maintenance', 'lost')),
            reasons TEXT NOT NULL DEFAULT '[]',
            last_seen TEXT,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL,
            engine_args TEXT NOT NULL DEFAULT '[]',
            speed TEXT NOT NULL DEFAULT '{}'
        )""",
        "INSERT INTO nodes_new SELECT name, address, vmid, proxmox_node, fabric, gpu_count, gpu_type, cpu_variant, "
        "engine_version, cert_fingerprint, state, reasons, last_seen, created_at, updated_at, engine_args, speed "
        "FROM nodes",
        "DROP TABLE nodes",
        "ALTER TABLE nodes_new RENAME TO nodes",
        """CREATE TRIGGER shard_gpus_exist BEFORE INSERT ON shard_gpus
            WHEN NEW.gpu >= (SELECT gpu_count FROM nodes WHERE name = NEW.node)
            BEGIN SELECT RAISE(ABORT, 'GPU index beyond the node''s GPU count'); END""",
        """CREATE TRIGGER nodes_keep_held_gpus BEFORE UPDATE OF gpu_count ON nodes
            WHEN EXISTS (SELECT 1 FROM shard_gpus WHERE node = NEW.name AND gpu >= NEW.gpu_count)
            BEGIN SELECT RAISE(ABORT, 'a shard holds a GPU beyond the new GPU count'); END""",
    )),
)
LATEST_VERSION = MIGRATIONS[-1][0]


class SchemaStore:
    """The schema: ``schema_version`` and ``_migrate``. The connection (``_conn``), ``path``, ``transaction`` and
    ``backup`` come from :class:`fleet_registry.FleetRegistry`, which passes the migrations to apply."""

    _conn: sqlite3.Connection
    path: str

    def schema_version(self) -> int:
        exists = self._conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'").fetchone()
        if not exists:
            return 0
        return self._conn.execute("SELECT COALESCE(MAX(version), 0) FROM schema_version").fetchone()[0]

    def _migrate(self, migrations: Migrations, latest: int) -> None:
        """Bring the file to version ``latest`` by ``migrations`` (fleet_registry's :data:`MIGRATIONS` and
        :data:`LATEST_VERSION`, read when the registry is opened)."""
        current = self.schema_version()
        if current == latest:
            return
        if 0 < current < latest and self.path != ":memory:" and os.path.isfile(self.path):
            self.backup(self.path + ".schema-v%d.bak" % current, replace=False)
        # A migration may rebuild a table others refer to; foreign keys cannot be switched inside a transaction.
        self._conn.execute("PRAGMA foreign_keys = OFF")
        try:
            self._migrate_all(migrations, latest)
        finally:
            self._conn.execute("PRAGMA foreign_keys = ON")

    def _migrate_all(self, migrations: Migrations, latest: int) -> None:
        with self.transaction():
            current = self.schema_version()  # again, now that we hold the write lock
            if current > latest:
                raise RegistrySchemaError(
                    "%s has schema version %d; this collection knows up to %d: upgrade the collection"
                    % (self.path, current, latest))
            self._conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_version ("
                "version INTEGER PRIMARY KEY, description TEXT NOT NULL, applied_at TEXT NOT NULL)")
            for version, description, statements in migrations:
                if version <= current:
                    continue
                try:
                    for statement in statements:
                        self._conn.execute(statement)
                except sqlite3.Error as exc:
                    raise RegistrySchemaError("migration %d (%s) failed: %s" % (version, description, exc))
                self._conn.execute("INSERT INTO schema_version VALUES (?, ?, ?)", (version, description, utc_now()))
            broken = self._conn.execute("PRAGMA foreign_key_check").fetchall()
            if broken:
                raise RegistrySchemaError("migration to version %d left %d rows whose references do not hold "
                                          "(first: %s)" % (latest, len(broken), tuple(broken[0])))
