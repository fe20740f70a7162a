# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The client's writes under parallel load: :class:`WriteSlots` (at most ``write_concurrency`` API writes at once
from this controller, across processes, each holding a flock on a slot file), :func:`is_lock_timeout` and the
backoff of an operation that gave up on a config file lock, and :class:`WriteCalls`, the write operations (clone,
create, configure, power, destroy), each run in a slot and tried again on such a lock.

Private to :mod:`proxmox_client` (which re-exports the public names); does I/O: the slot lock files under
``~/.cache/llmgw/proxmox-writes`` (flock), and the API calls of :class:`proxmox_client.ProxmoxClient`.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import time

from ansible_collections.llmgw.fleet.plugins.module_utils.proxmox_errors import ProxmoxError, Timeout

# Seconds slept before each new try of an operation refused on a config file lock (a jitter of up to half is
# added, so that forks that met one lock do not meet again); then the lock error is raised with its tries.
LOCK_RETRY_DELAYS = (1.0, 2.0, 4.0, 8.0)
LOCK_TIMEOUT_RE = re.compile(r"can't lock file '[^']*' - got timeout")
WRITE_SLOT_WAIT = 3600


def is_lock_timeout(error):
    """Whether a failed operation gave up on a config file lock, having done nothing."""
    text = getattr(error, "exitstatus", None) or str(error)
    return bool(LOCK_TIMEOUT_RE.search(text or ""))


class WriteSlots:
    """At most ``count`` API writes at once from this controller, across processes: each write holds an exclusive
    flock on one of ``count`` files in ``directory`` for as long as it runs (its task included). 0: no limit."""

    def __init__(self, directory, count, sleep=time.sleep, clock=time.monotonic, wait=WRITE_SLOT_WAIT):
        self.directory = directory
        self.count = count
        self._sleep = sleep
        self._clock = clock
        self._wait = wait

    @classmethod
    def for_settings(cls, settings, **kwargs):
        base = os.path.join(os.path.expanduser("~"), ".cache", "llmgw", "proxmox-writes")
        host = re.sub(r"[^A-Za-z0-9_.-]", "_", "%s_%s" % (settings.host, settings.port))
        return cls(os.path.join(base, host), settings.write_concurrency, **kwargs)

    def _take(self):
        for index in range(self.count):
            fd = os.open(os.path.join(self.directory, "slot-%d.lock" % index), os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            except OSError as exc:
                os.close(fd)
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
        return None

    @contextlib.contextmanager
    def hold(self, what):
        if not self.count:
            yield
            return
        os.makedirs(self.directory, mode=0o700, exist_ok=True)
        deadline = self._clock() + self._wait
        fd = self._take()
        while fd is None:
            if self._clock() >= deadline:
                raise Timeout(
                    "%s: no Proxmox write slot came free in %ss (%d writes at once from this controller, see "
                    "write_concurrency; the lock files are in %s)" % (what, self._wait, self.count, self.directory),
                    what="write slot",
                )
            self._sleep(0.2)
            fd = self._take()
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


class WriteCalls:
    """The write operations of :class:`proxmox_client.ProxmoxClient`, each one call and its task through
    :meth:`_write`. The calls (``post``, ``delete``, ``_vm_path``, ``_run_task``), ``_sleep``, ``_jitter`` and
    ``_write_slots`` come from ProxmoxClient."""

    def _write(self, what, operation):
        """One write operation (a call and its task): in a write slot, tried again when it gave up on a config
        file lock. Only a lock timeout is tried again: the operation did nothing then, whatever it was."""
        for attempt in range(len(LOCK_RETRY_DELAYS) + 1):
            try:
                if self._write_slots is None:
                    return operation()
                with self._write_slots.hold(what):
                    return operation()
            except ProxmoxError as exc:
                if not is_lock_timeout(exc):
                    raise
                if attempt == len(LOCK_RETRY_DELAYS):
                    exc.message = "%s (tried %d times over %.0f s: another operation holds that lock; the node's " \
                        "task list shows which)" % (exc.message, attempt + 1, sum(LOCK_RETRY_DELAYS))
                    exc.args = (exc.message,)
                    raise
                delay = LOCK_RETRY_DELAYS[attempt]
                self._sleep(delay + delay * 0.5 * self._jitter())

    def clone_vm(self, node, template_vmid, newid, name, timeout, full=None, target=None, storage=None, pool=None):
        params = dict(newid=int(newid), name=name)
        if full is not None:
            params["full"] = 1 if full else 0
        for key, value in (("target", target), ("storage", storage), ("pool", pool)):
            if value:
                params[key] = value
        path = self._vm_path(node, template_vmid, "clone")
        return self._write("clone %s to %s" % (template_vmid, newid),
                           lambda: self._run_task(self.post(path, **params), timeout))

    def create_vm(self, node, vmid, params, timeout):
        return self._write("create %s" % vmid,
                           lambda: self._run_task(self.post("nodes/%s/qemu" % node, vmid=int(vmid), **params), timeout))

    def update_config(self, node, vmid, params, timeout, digest=None, delete=None):
        """Change the config in one call; a stale ``digest`` raises ConfigChanged."""
        body = dict(params)
        if digest:
            body["digest"] = digest
        if delete:
            body["delete"] = ",".join(delete)
        return self._write("configure %s" % vmid,
                           lambda: self._run_task(self.post(self._vm_path(node, vmid, "config"), **body), timeout))

    def _power(self, node, vmid, action, timeout, params=None):
        path = self._vm_path(node, vmid, "status", action)
        params = params or {}
        return self._write("%s %s" % (action, vmid), lambda: self._run_task(self.post(path, **params), timeout))

    def start_vm(self, node, vmid, timeout):
        return self._power(node, vmid, "start", timeout)

    def stop_vm(self, node, vmid, timeout):
        return self._power(node, vmid, "stop", timeout)

    def shutdown_vm(self, node, vmid, timeout, grace):
        """ACPI shutdown; after ``grace`` seconds PVE stops the VM hard (``forceStop``)."""
        return self._power(node, vmid, "shutdown", timeout, {"timeout": int(grace), "forceStop": 1})

    def reboot_vm(self, node, vmid, timeout):
        return self._power(node, vmid, "reboot", timeout)

    def delete_vm(self, node, vmid, timeout):
        params = {"purge": 1, "destroy-unreferenced-disks": 1}
        return self._write("destroy %s" % vmid,
                           lambda: self._run_task(self.delete(self._vm_path(node, vmid), **params), timeout))
