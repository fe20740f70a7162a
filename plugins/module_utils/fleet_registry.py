# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fleet registry: nodes, replicas and their shards in an embedded SQLite database on the controller.

Where it lives: the ``db`` option of whatever uses it, else ``$LLMGW_FLEET_DB``, else
``$XDG_DATA_HOME/llmgw/fleet.db`` (``~/.local/share/llmgw/fleet.db`` when XDG_DATA_HOME is unset).

Durability and concurrency: WAL journal, foreign keys on, every change in one ``BEGIN IMMEDIATE``
transaction (an interrupted playbook leaves the change out entirely, never half a replica), and a busy
timeout so concurrent playbooks on one controller queue for the write lock instead of failing. Callers that
read, decide and write (placement and repair in :mod:`fleet_service`) do it inside one :meth:`transaction`, so
two playbooks placing at once cannot hand out the same GPU; the ``shard_gpus`` primary key refuses it at the
database level too.

Storage only: schema, migrations, queries, transactions and typed errors; it knows nothing of the solver. The
parts: :mod:`_registry_rows` (states, fields, errors, row <-> dict), :mod:`_registry_nodes` and
:mod:`_registry_replicas` (the queries and checked writes), :mod:`_registry_schema` (the schema, :data:`MIGRATIONS`
and the migration procedure); this module is the one callers import, and re-exports their public names.

The schema is versioned (``schema_version``); :data:`MIGRATIONS` upgrade an older file when it is opened, after a
backup of it beside itself.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from typing import Dict, Iterator, Mapping, Optional

from ansible_collections.llmgw.fleet.plugins.module_utils._registry_nodes import NodeStore
from ansible_collections.llmgw.fleet.plugins.module_utils._registry_replicas import ReplicaStore
from ansible_collections.llmgw.fleet.plugins.module_utils._registry_rows import (
    NODE_FIELDS,
    NODE_STATES,
    REPLICA_FIELDS,
    REPLICA_STATES,
    SHARD_STATES,
    RegistryConflict,
    RegistryCorrupt,
    RegistryError,
    RegistryNotFound,
    RegistrySchemaError,
    normalize_timestamp,
    not_a_registry,
    utc_now,
)
from ansible_collections.llmgw.fleet.plugins.module_utils._registry_schema import (
    LATEST_VERSION,
    MIGRATIONS,
    SchemaStore,
)

__all__ = ["DEFAULT_BUSY_TIMEOUT", "ENV_VAR", "LATEST_VERSION", "MIGRATIONS", "NODE_FIELDS", "NODE_STATES",
           "REPLICA_FIELDS", "REPLICA_STATES", "SHARD_STATES", "FleetRegistry", "RegistryConflict", "RegistryCorrupt",
           "RegistryError", "RegistryNotFound", "RegistrySchemaError", "create_private", "default_path", "make_private",
           "normalize_timestamp", "not_a_registry", "open_for_module", "resolve_path", "utc_now"]

ENV_VAR = "LLMGW_FLEET_DB"
DEFAULT_BUSY_TIMEOUT = 30.0


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


class FleetRegistry(NodeStore, ReplicaStore, SchemaStore):
    """One connection to the registry. Use as a context manager, or call :meth:`close`. Its nodes' and
    replicas' queries and writes are in :class:`NodeStore` and :class:`ReplicaStore`, its schema version and
    migrations in :class:`SchemaStore`."""

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
            # This module's names, read at each open (a test pins an older schema by patching them here).
            self._migrate(MIGRATIONS, LATEST_VERSION)
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

    # -- backups ------------------------------------------------------------------------------------------

    def backup(self, target: str, replace: bool = True) -> str:
        """A consistent copy of the registry at ``target`` (SQLite's online backup: writers may go on), mode 0600.
        With ``replace`` False an existing ``target`` is kept (the first backup of a schema version stays)."""
        target = os.path.abspath(os.path.expanduser(target))
        if replace and os.path.exists(target):
            os.remove(target)
        try:
            create_private(target)
        except FileExistsError:
            if replace:
                raise
            return target
        copy = sqlite3.connect(target)
        try:
            self._conn.backup(copy)
        finally:
            copy.close()
        return target

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

    # -- the whole fleet ----------------------------------------------------------------------------------

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


def open_for_module(path: Optional[str], check_mode: bool, create: bool = True) -> FleetRegistry:
    """The registry itself, or in check mode an in-memory copy, so check mode runs the very same checks. With
    ``create`` False a missing registry is :class:`RegistryNotFound` (a module that only acts on what is recorded)."""
    if not create and not os.path.exists(resolve_path(path)):
        raise RegistryNotFound("no fleet registry at %s" % resolve_path(path))
    return FleetRegistry.scratch_copy(path) if check_mode else FleetRegistry(path)
