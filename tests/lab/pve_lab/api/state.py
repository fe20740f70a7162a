"""The lab's persistent state (`.lab/api/state.json`): VM configs as PVE keeps them, and the volumes they use.

A VM's config is stored as PVE stores `/etc/pve/qemu-server/N.conf`: string values, a [PENDING] section for what
a running VM cannot take yet. Its `digest` is the SHA1 of that file's text, so any change changes it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Dict, Iterator, List, Optional

from pve_lab.api.errors import fail


@dataclass
class VM:
    vmid: int
    config: Dict[str, str]
    pending: Dict[str, str] = field(default_factory=dict)
    pending_delete: List[str] = field(default_factory=list)
    has_os: bool = False  # cloned, directly or not, from the lab's cloud-init template
    nonce: str = field(default_factory=lambda: uuid.uuid4().hex)  # new on every (re)creation
    status: str = "stopped"
    started_at: Optional[float] = None
    cloudinit_image: Optional[Dict[str, str]] = None  # the cloud-init values the drive was last generated from

    @property
    def is_template(self) -> bool:
        return self.config.get("template") == "1"

    @property
    def lock(self) -> Optional[str]:
        return self.config.get("lock")

    def effective(self) -> Dict[str, str]:
        """The config with pending changes applied: what `GET config` shows by default."""
        merged = {k: v for k, v in self.config.items() if k not in self.pending_delete}
        merged.update(self.pending)
        return merged

    def apply_pending(self) -> None:
        for key in self.pending_delete:
            self.config.pop(key, None)
        self.config.update(self.pending)
        self.pending, self.pending_delete = {}, []

    def raw(self) -> str:
        """The config file's text, written as PVE::QemuServer::write_vm_config writes it."""
        text = _section(self.config)
        if self.pending or self.pending_delete:
            text += "\n[PENDING]\n" + _section(self.pending)
            if self.pending_delete:
                text += "delete: %s\n" % ",".join(self.pending_delete)
        return text

    def digest(self) -> str:
        return hashlib.sha1(self.raw().encode()).hexdigest()


def _section(conf: Dict[str, str]) -> str:
    text = ""
    if "description" in conf:
        text += "".join("#%s\n" % line for line in conf["description"].split("\n")) if conf["description"] else "#\n"
    for key in sorted(conf):
        if key != "description":
            text += "%s: %s\n" % (key, conf[key])
    return text


class LabState:
    """All VMs and volumes, behind one lock; every change is written to disk before the lock is released."""

    def __init__(self, path: str):
        self.path = path
        self.lock = threading.RLock()
        self.vms: Dict[int, VM] = {}
        self.volumes: Dict[str, int] = {}  # volid -> size in bytes
        self.fresh = not os.path.exists(path)
        if not self.fresh:
            with open(path) as handle:
                data = json.load(handle)
            self.vms = {int(k): VM(**v) for k, v in data["vms"].items()}
            self.volumes = data["volumes"]

    def save(self) -> None:
        with self.lock:
            data = {"vms": {str(k): asdict(v) for k, v in sorted(self.vms.items())}, "volumes": self.volumes}
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            tmp = self.path + ".tmp"
            with open(tmp, "w") as handle:
                json.dump(data, handle, indent=1, sort_keys=True)
            os.replace(tmp, self.path)

    @contextlib.contextmanager
    def change(self) -> Iterator[LabState]:
        with self.lock:
            yield self
            self.save()


class _SharedLock:
    """flock(2) semantics: any number of shared holders, or one exclusive holder."""

    def __init__(self):
        self._cond = threading.Condition()
        self._shared = 0
        self._exclusive = False

    def acquire(self, shared: bool, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._exclusive or (not shared and self._shared):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            if shared:
                self._shared += 1
            else:
                self._exclusive = True
            return True

    def release(self, shared: bool) -> None:
        with self._cond:
            if shared:
                self._shared -= 1
            else:
                self._exclusive = False
            self._cond.notify_all()


class FileLocks:
    """The lock files qemu-server and pve-storage take, by path (pve-common PVE::Tools::lock_file_full: flock,
    shared or exclusive, 10 s when no timeout is given; on timeout the caller dies with
    "can't lock file '<path>' - got timeout")."""

    def __init__(self):
        self._guard = threading.Lock()
        self._locks: Dict[str, _SharedLock] = {}

    @contextlib.contextmanager
    def hold(self, path: str, timeout: float = 10.0, shared: bool = False) -> Iterator[None]:
        with self._guard:
            lock = self._locks.setdefault(path, _SharedLock())
        if not lock.acquire(shared, timeout):
            raise fail("can't lock file '%s' - got timeout" % path)
        try:
            yield
        finally:
            lock.release(shared)


def config_lock_path(vmid: int) -> str:
    return "/var/lock/qemu-server/lock-%d.conf" % vmid


class ConfigLocks:
    """The per-VM config file lock (PVE::AbstractConfig::lock_config: exclusive, 10 s; lock_config_shared)."""

    def __init__(self):
        self._files = FileLocks()

    @contextlib.contextmanager
    def hold(self, vmid: int, timeout: float = 10.0, shared: bool = False) -> Iterator[None]:
        with self._files.hold(config_lock_path(vmid), timeout, shared):
            yield
