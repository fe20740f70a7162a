# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one Proxmox VE client of the collection, on proxmoxer.

It authenticates by API token or password, verifies TLS by default (optionally against a CA file), waits for
tasks itself (a task that ends in an error fails at once, with the tail of its log; ``WARNINGS: N`` counts as
success) and raises the typed errors of ``proxmox_errors``. It never calls ``fail_json``: the modules that use it
(``pve_vm`` and ``pve_vm_info`` through ``pve_vm_runner``, ``wait_for_node`` through ``node_wait``) turn its
errors into their own messages.

Under parallel load (the forks of one add_node run) it keeps to what Proxmox VE does: an operation that fails on
a config file lock ("can't lock file '...' - got timeout": qemu-server's lock_config_full/lock_config_shared gave
up, nothing was done) is tried again with backoff, a bounded number of times; and at most
``write_concurrency`` writes (their tasks included) run at once from this controller, across processes.

The parts, each private (this module is the one callers import, and re-exports their public names):
:mod:`_proxmox_connection` (the connection settings, from parameters and ``PROXMOX_*``), :mod:`_proxmox_writes`
(the write slots, the lock retries and the write operations), :mod:`_proxmox_tasks` (task ids, a task waited for,
its log's tail); the session, the raw calls, the reads and the guest agent are here.
"""

from __future__ import annotations

import random
import time
import traceback

from ansible_collections.llmgw.fleet.plugins.module_utils._proxmox_connection import (
    DEFAULT_HTTP_TIMEOUT,
    DEFAULT_PORT,
    DEFAULT_WRITE_CONCURRENCY,
    ENV_FALLBACKS,
    ConnectionSettings,
    settings_from_params,
)
from ansible_collections.llmgw.fleet.plugins.module_utils._proxmox_tasks import (
    TASK_LOG_TAIL,
    TaskCalls,
    parse_upid,
    task_succeeded,
)
from ansible_collections.llmgw.fleet.plugins.module_utils._proxmox_writes import (
    LOCK_RETRY_DELAYS,
    LOCK_TIMEOUT_RE,
    WRITE_SLOT_WAIT,
    WriteCalls,
    WriteSlots,
    is_lock_timeout,
)
from ansible_collections.llmgw.fleet.plugins.module_utils.proxmox_errors import (
    AuthError,
    ConnectionFailed,
    Locked,
    NotFound,
    PermissionDenied,
    ProxmoxError,
    Timeout,
    TLSVerificationFailed,
    classify,
    classify_agent,
)

try:
    import requests
    from proxmoxer import AuthenticationError, ProxmoxAPI, ResourceException

    HAS_PROXMOXER = True
    PROXMOXER_IMPORT_ERROR = None
except ImportError:  # reported by the caller with missing_required_lib
    HAS_PROXMOXER = False
    PROXMOXER_IMPORT_ERROR = traceback.format_exc()

__all__ = ["DEFAULT_HTTP_TIMEOUT", "DEFAULT_PORT", "DEFAULT_WRITE_CONCURRENCY", "ENV_FALLBACKS", "GET_ATTEMPTS",
           "HAS_PROXMOXER", "LOCK_RETRY_DELAYS", "LOCK_TIMEOUT_RE", "PROXMOXER_IMPORT_ERROR", "TASK_LOG_TAIL",
           "TRANSIENT_STATUS", "WRITE_SLOT_WAIT", "ConnectionSettings", "ProxmoxClient", "WriteSlots",
           "is_lock_timeout", "match_vms", "parse_upid", "settings_from_params", "task_succeeded"]

GET_ATTEMPTS = 3
TRANSIENT_STATUS = frozenset([502, 503, 504, 595, 596])


def match_vms(guests, name=None, vmid=None):
    """The VMs among ``guests`` (as ``guests()`` lists them) with exactly that name and/or that VMID: the one way
    a VM is looked up. Containers share the VMID space but are never matched."""
    return [
        g for g in guests
        if g.get("type") == "qemu" and (name is None or g.get("name") == name)
        and (vmid is None or g["vmid"] == int(vmid))
    ]


def _translate(exc, what):
    """Map an exception of proxmoxer/requests to the typed error; None when it is none of theirs."""
    if not HAS_PROXMOXER:
        return None
    if isinstance(exc, ResourceException):
        return classify(exc.status_code, exc.content, exc.errors)
    if isinstance(exc, AuthenticationError):
        return AuthError("authentication failed: %s" % exc, status=401)
    if isinstance(exc, requests.exceptions.SSLError):
        return TLSVerificationFailed(
            "TLS verification of the Proxmox API failed (%s): %s. Point ca_path (PROXMOX_CA_PATH) at the CA that "
            "signed the server certificate; validate_certs: false is for throwaway labs only." % (what, exc)
        )
    if isinstance(exc, requests.exceptions.Timeout):
        return Timeout("the Proxmox API did not answer %s in time: %s" % (what, exc), what=what)
    if isinstance(exc, requests.exceptions.ConnectionError):
        return ConnectionFailed("cannot reach the Proxmox API (%s): %s" % (what, exc))
    return None


class ProxmoxClient(WriteCalls, TaskCalls):
    """Typed access to the parts of the PVE API the collection uses. The write operations (``clone_vm`` to
    ``delete_vm``) are inherited from :class:`_proxmox_writes.WriteCalls`, the task waits (``wait_task``,
    ``task_log_tail``) from :class:`_proxmox_tasks.TaskCalls`."""

    def __init__(self, api, settings=None, sleep=time.sleep, clock=time.monotonic, poll_interval=1.0,
                 write_slots=None, jitter=random.random):
        self._api = api
        self.settings = settings
        self._sleep = sleep
        self._clock = clock
        self._poll_interval = poll_interval
        if write_slots is None and settings is not None:
            write_slots = WriteSlots.for_settings(settings, sleep=sleep, clock=clock)
        self._write_slots = write_slots
        self._jitter = jitter

    @classmethod
    def connect(cls, settings, **kwargs):
        """Open a session (password auth asks for a ticket here; a token is first used by the first call)."""
        return cls(cls._session(settings), settings=settings, **kwargs)

    @staticmethod
    def _session(settings):
        if not HAS_PROXMOXER:
            raise ProxmoxError("proxmoxer and requests are required: %s" % PROXMOXER_IMPORT_ERROR)
        options = dict(
            host=settings.host,
            port=settings.port,
            user=settings.user,
            verify_ssl=settings.verify,
            timeout=settings.timeout,
        )
        if settings.token_id:
            options.update(token_name=settings.token_id, token_value=settings.token_secret)
        else:
            options.update(password=settings.password)
        try:
            api = ProxmoxAPI(**options)
        except Exception as exc:
            typed = _translate(exc, "logging in as %s" % settings.user)
            if typed is None:
                raise
            raise typed
        return api

    # ------------------------------------------------------------------------------------------- raw calls

    def _call(self, method, resource, **params):
        """One API call (see ``_call_once``). With password auth, a ticket PVE no longer takes (past its two hours,
        or signed with a key the cluster has since rotated) is replaced by a new login and the call made again,
        once: PVE checks the ticket before it does anything, so even a write refused so was not done."""
        try:
            return self._call_once(method, resource, **params)
        except AuthError:
            if self.settings is None or self.settings.token_id or not self.settings.password:
                raise
        self._api = self._session(self.settings)
        return self._call_once(method, resource, **params)

    def _call_once(self, method, resource, **params):
        """One API call, its failure typed. A read that meets a transient failure (gateway, connection, an answer
        slower than the timeout) is tried again a few times; a write never is, since it may have been done."""
        attempts = GET_ATTEMPTS if method == "get" else 1
        call = "%s /%s" % (method.upper(), resource)
        for attempt in range(1, attempts + 1):
            try:
                return getattr(self._api(resource), method)(**params)
            except Exception as exc:
                typed = _translate(exc, call)
                if typed is None:
                    raise
                if isinstance(typed, PermissionDenied):  # which call was refused tells what to grant
                    typed.message = "%s: %s" % (call, typed.message)
                    typed.args = (typed.message,)
                transient = isinstance(typed, (ConnectionFailed, Timeout)) or typed.status in TRANSIENT_STATUS
                if transient and method != "get" and not isinstance(typed, TLSVerificationFailed):
                    typed.message = ("%s: %s; not repeated, since it may have been done: run again, and the run "
                                     "reads what is there first" % (call, typed.message))
                    typed.args = (typed.message,)
                if not transient or isinstance(typed, TLSVerificationFailed) or attempt == attempts:
                    raise typed
                self._sleep(0.5 * attempt)

    def get(self, resource, **params):
        return self._call("get", resource, **params)

    def post(self, resource, **params):
        return self._call("post", resource, **params)

    def put(self, resource, **params):
        return self._call("put", resource, **params)

    def delete(self, resource, **params):
        return self._call("delete", resource, **params)

    # --------------------------------------------------------------------------------------------- cluster

    def version(self):
        return self.get("version")

    def nodes(self):
        return [n.get("node") for n in self.get("nodes") or [] if n.get("node")]

    def guests(self):
        """Every VM and container of the cluster (``type`` qemu or lxc), with ``vmid`` an int."""
        result = []
        for entry in self.get("cluster/resources", type="vm") or []:
            guest = dict(entry)
            guest["vmid"] = int(guest["vmid"])
            guest["template"] = bool(int(guest.get("template") or 0))
            result.append(guest)
        return result

    def qemu_vms(self):
        """Only the VMs; containers share the VMID space but are never matched by name or address."""
        return [g for g in self.guests() if g.get("type") == "qemu"]

    def find_vms(self, name=None, vmid=None):
        """The VMs (templates included) called ``name`` and/or with VMID ``vmid``, in the API's order."""
        return match_vms(self.guests(), name=name, vmid=vmid)

    def next_free_id(self):
        """The first free VMID of the datacenter's next-id range (PVE returns it as a string)."""
        return int(self.get("cluster/nextid"))

    def privileges(self, path):
        """The privileges the caller (the token, or the user) holds on ACL ``path``: a set of names."""
        held = self.get("access/permissions", path=path) or {}
        return set((held.get(path) or {}).keys())

    # ---------------------------------------------------------------------------------------------- one VM

    @staticmethod
    def _vm_path(node, vmid, *rest):
        return "/".join(["nodes", str(node), "qemu", str(int(vmid))] + [str(r) for r in rest])

    def vm_config(self, node, vmid, current=False):
        """The config with its ``digest``; pending values applied unless ``current``."""
        params = {"current": 1} if current else {}
        return self.get(self._vm_path(node, vmid, "config"), **params) or {}

    def vm_status(self, node, vmid):
        return self.get(self._vm_path(node, vmid, "status", "current")) or {}

    def pending_keys(self, node, vmid):
        """Keys whose change waits for the VM's next boot: config ``/pending`` and the cloud-init drive.

        An endpoint this server does not have contributes nothing.
        """
        keys = set()
        for endpoint in ("pending", "cloudinit"):
            try:
                entries = self.get(self._vm_path(node, vmid, endpoint)) or []
            except NotFound:
                continue
            for entry in entries:
                if "pending" in entry or entry.get("delete"):
                    keys.add(entry.get("key"))
        keys.discard(None)
        return sorted(keys)

    def wait_unlocked(self, node, vmid, timeout):
        """The config once no ``lock`` is set; Locked naming the lock when it stays past ``timeout``."""
        deadline = self._clock() + timeout
        delay = 0.2
        while True:
            config = self.vm_config(node, vmid)
            lock = config.get("lock")
            if not lock:
                return config
            if self._clock() >= deadline:
                raise Locked(
                    "VM %s (%s) on node %s stayed locked (%s) for %ss"
                    % (config.get("name") or "", vmid, node, lock, timeout),
                    reason=lock,
                )
            self._sleep(delay)
            delay = min(delay * 2, self._poll_interval)

    # ----------------------------------------------------------------------------------------- guest agent

    def _agent_call(self, method, node, vmid, endpoint, **params):
        """One ``agent/*`` call; its failure typed as AgentNotConfigured, VMNotRunning or AgentNotRunning."""
        try:
            return self._call(method, self._vm_path(node, vmid, "agent", endpoint), **params)
        except ProxmoxError as exc:
            typed = classify_agent(exc)
            if typed is exc:
                raise
            raise typed

    def agent_ping(self, node, vmid):
        """Returns when the agent answers; raises AgentNotConfigured, VMNotRunning or AgentNotRunning."""
        self._agent_call("post", node, vmid, "ping")

    def agent_exec(self, node, vmid, argv, timeout, input_data=None):
        """Run ``argv`` in the guest and wait for it: ``{"exitcode": int, "out": str, "err": str}``.

        Timeout when it has not exited after ``timeout`` seconds (the guest process is left running)."""
        params = {"command": [str(a) for a in argv]}
        if input_data is not None:
            params["input-data"] = input_data
        pid = int((self._agent_call("post", node, vmid, "exec", **params) or {})["pid"])
        deadline = self._clock() + timeout
        delay = 0.1
        while True:
            status = self._agent_call("get", node, vmid, "exec-status", pid=pid) or {}
            if status.get("exited") in (True, 1, "1"):
                return {"exitcode": int(status.get("exitcode") or 0), "out": status.get("out-data") or "",
                        "err": status.get("err-data") or ""}
            if self._clock() >= deadline:
                message = "%s in VM %s (guest pid %d) still running after %ss" % (" ".join(argv), vmid, pid, timeout)
                raise Timeout(message, what="agent exec")
            self._sleep(delay)
            delay = min(delay * 2, self._poll_interval)

    def agent_read_file(self, node, vmid, path, timeout=30):
        """A file of the guest as text: ``agent/file-read``, or ``cat`` through ``agent/exec`` where the server
        has no file-read. ProxmoxError when the guest cannot read it."""
        try:
            answer = self._agent_call("get", node, vmid, "file-read", file=path) or {}
        except NotFound:
            answer = None
        if answer is not None:
            if answer.get("truncated"):
                raise ProxmoxError("%s in VM %s is larger than agent/file-read returns" % (path, vmid))
            return answer.get("content") or ""
        result = self.agent_exec(node, vmid, ["cat", path], timeout)
        if result["exitcode"] != 0:
            raise ProxmoxError(
                "cannot read %s in VM %s through the guest agent: %s" % (path, vmid, result["err"].strip()))
        return result["out"]
