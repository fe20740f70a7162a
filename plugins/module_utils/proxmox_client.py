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
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import random
import re
import time
import traceback
from collections import namedtuple

from ansible_collections.llmgw.fleet.plugins.module_utils.proxmox_errors import (
    AuthError,
    ConnectionFailed,
    Locked,
    NotFound,
    ProxmoxError,
    TaskFailed,
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

DEFAULT_PORT = 8006
DEFAULT_HTTP_TIMEOUT = 30
TASK_LOG_TAIL = 20
GET_ATTEMPTS = 3
TRANSIENT_STATUS = frozenset([502, 503, 504, 595, 596])
DEFAULT_WRITE_CONCURRENCY = 4
# Seconds slept before each new try of an operation refused on a config file lock (a jitter of up to half is
# added, so that forks that met one lock do not meet again); then the lock error is raised with its tries.
LOCK_RETRY_DELAYS = (1.0, 2.0, 4.0, 8.0)
LOCK_TIMEOUT_RE = re.compile(r"can't lock file '[^']*' - got timeout")
WRITE_SLOT_WAIT = 3600

ENV_FALLBACKS = {
    "api_host": "PROXMOX_HOST",
    "api_port": "PROXMOX_PORT",
    "api_user": "PROXMOX_USER",
    "api_password": "PROXMOX_PASSWORD",
    "api_token_id": "PROXMOX_TOKEN_ID",
    "api_token_secret": "PROXMOX_TOKEN_SECRET",
    "ca_path": "PROXMOX_CA_PATH",
    "node": "PROXMOX_NODE",
}


class ConnectionSettings(
    namedtuple(
        "ConnectionSettings",
        ["host", "port", "user", "password", "token_id", "token_secret", "validate_certs", "ca_path", "timeout",
         "write_concurrency"],
        defaults=(DEFAULT_WRITE_CONCURRENCY,),
    )
):
    """How to reach and authenticate to the API. Build it with ``settings_from_params``."""

    __slots__ = ()

    @property
    def auth_method(self):
        return "token" if self.token_id else "password"

    @property
    def verify(self):
        """What requests takes as ``verify``: a CA file, True, or False."""
        if not self.validate_certs:
            return False
        return self.ca_path or True


def settings_from_params(params, environ=None):
    """ConnectionSettings from module-style parameters, falling back to ``PROXMOX_*`` environment variables.

    Raises ProxmoxError naming what is missing. A token id may be given whole (``user@realm!name``), in which
    case it also supplies the user.
    """
    environ = environ or {}

    def pick(key):
        value = params.get(key)
        if value in (None, "") and key in ENV_FALLBACKS:
            value = environ.get(ENV_FALLBACKS[key])
        return value if value not in ("",) else None

    host = pick("api_host")
    user = pick("api_user")
    password = pick("api_password")
    token_id = pick("api_token_id")
    token_secret = pick("api_token_secret")
    if token_id and "!" in token_id:
        token_user, token_id = token_id.split("!", 1)
        if user and user != token_user:
            raise ProxmoxError(
                "api_token_id names user %s but api_user is %s; give one or make them agree" % (token_user, user)
            )
        user = token_user
    missing = [name for name, value in (("api_host", host), ("api_user", user)) if not value]
    if token_id and not token_secret:
        missing.append("api_token_secret")
    if not token_id and not password:
        missing.append("api_password (or api_token_id and api_token_secret)")
    if missing:
        raise ProxmoxError(
            "missing Proxmox connection parameters: %s (each also reads its PROXMOX_* environment variable)"
            % ", ".join(missing)
        )
    port = pick("api_port")
    validate_certs = params.get("validate_certs")
    return ConnectionSettings(
        host=host,
        port=int(port) if port else DEFAULT_PORT,
        user=user,
        password=password if not token_id else None,
        token_id=token_id,
        token_secret=token_secret if token_id else None,
        validate_certs=True if validate_certs is None else bool(validate_certs),
        ca_path=pick("ca_path"),
        timeout=int(params.get("api_timeout") or DEFAULT_HTTP_TIMEOUT),
        write_concurrency=_write_concurrency(params.get("write_concurrency")),
    )


def _write_concurrency(value):
    if value is None:
        return DEFAULT_WRITE_CONCURRENCY
    try:
        count = int(value)
    except (TypeError, ValueError):
        count = -1
    if count < 0:
        raise ProxmoxError(
            "write_concurrency must be a count of API writes at once (0 for no limit), got %r: set "
            "fleet_proxmox.write_concurrency to a whole number such as %d" % (value, DEFAULT_WRITE_CONCURRENCY)
        )
    return count


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


def parse_upid(upid):
    """``UPID:node:pid:pstart:starttime:type:id:user:`` -> dict (node, type, id, user)."""
    parts = str(upid or "").split(":")
    if len(parts) < 8 or parts[0] != "UPID":
        raise ProxmoxError("not a task id (UPID): %r" % (upid,))
    return {"node": parts[1], "type": parts[5], "id": parts[6], "user": parts[7], "upid": upid}


def task_succeeded(exitstatus):
    """``OK`` and ``WARNINGS: N`` are success; anything else is the task's error text."""
    text = str(exitstatus or "")
    return text == "OK" or text.startswith("WARNINGS:")


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


class ProxmoxClient:
    """Typed access to the parts of the PVE API the collection uses."""

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
        return cls(api, settings=settings, **kwargs)

    # ------------------------------------------------------------------------------------------- raw calls

    def _call(self, method, path, **params):
        """One API call, its failure typed. A read that meets a transient failure (gateway, connection) is tried
        again a few times; a write never is, since it may have been done."""
        attempts = GET_ATTEMPTS if method == "get" else 1
        for attempt in range(1, attempts + 1):
            try:
                return getattr(self._api(path), method)(**params)
            except Exception as exc:
                typed = _translate(exc, "%s /%s" % (method.upper(), path))
                if typed is None:
                    raise
                transient = isinstance(typed, ConnectionFailed) or typed.status in TRANSIENT_STATUS
                if not transient or isinstance(typed, TLSVerificationFailed) or attempt == attempts:
                    raise typed
                self._sleep(0.5 * attempt)

    def get(self, path, **params):
        return self._call("get", path, **params)

    def post(self, path, **params):
        return self._call("post", path, **params)

    def put(self, path, **params):
        return self._call("put", path, **params)

    def delete(self, path, **params):
        return self._call("delete", path, **params)

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

    # ------------------------------------------------------------------------------------------ operations

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

    # ----------------------------------------------------------------------------------------------- tasks

    def _run_task(self, result, timeout):
        """Calls that may answer with a UPID (or null, when the server did the work synchronously)."""
        if isinstance(result, str) and result.startswith("UPID:"):
            return self.wait_task(result, timeout)
        return result

    def task_log_tail(self, upid, lines=TASK_LOG_TAIL):
        node = parse_upid(upid)["node"]
        try:
            entries = self.get("nodes/%s/tasks/%s/log" % (node, upid), start=0, limit=100000) or []
        except ProxmoxError:
            return []
        entries = sorted(entries, key=lambda e: int(e.get("n", 0)))
        return [str(e.get("t", "")) for e in entries[-lines:]]

    def wait_task(self, upid, timeout):
        """Wait for a task; return its exit status. TaskFailed at once on an error, Timeout past ``timeout``."""
        info = parse_upid(upid)
        path = "nodes/%s/tasks/%s/status" % (info["node"], upid)
        deadline = self._clock() + timeout
        delay = 0.1
        while True:
            status = self.get(path) or {}
            if status.get("status") == "stopped":
                exitstatus = status.get("exitstatus")
                if task_succeeded(exitstatus):
                    return exitstatus
                tail = self.task_log_tail(upid)
                raise TaskFailed(
                    "task %s %s on node %s failed: %s%s"
                    % (
                        info["type"],
                        info["id"],
                        info["node"],
                        exitstatus,
                        ("\n--- task log (last %d lines) ---\n%s" % (len(tail), "\n".join(tail))) if tail else "",
                    ),
                    upid=upid,
                    exitstatus=exitstatus,
                    log_tail=tail,
                )
            if self._clock() >= deadline:
                tail = self.task_log_tail(upid)
                raise Timeout(
                    "task %s %s on node %s still running after %ss (it was not stopped: %s)%s"
                    % (
                        info["type"],
                        info["id"],
                        info["node"],
                        timeout,
                        upid,
                        ("\n--- task log (last %d lines) ---\n%s" % (len(tail), "\n".join(tail))) if tail else "",
                    ),
                    what="task",
                    upid=upid,
                    log_tail=tail,
                )
            self._sleep(delay)
            delay = min(delay * 2, self._poll_interval)
