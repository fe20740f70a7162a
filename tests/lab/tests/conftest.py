"""Fixtures for the lab's conformance tests: the running lab, proxmoxer clients, faults, VMs that clean up.

The session starts the lab with `python -m pve_lab up` when it does not answer (or runs without the real node
backend while that one is available), and brings it down again at the end if it started it (set
LLMGW_LAB_KEEP=1 to leave it running). Without the node backend (`pve_lab.nodes.backend` missing) the lab runs
with VMs that have no guest, and the tests that need a guest are skipped, saying why. LLMGW_LAB_NO_NODES=1
forces that mode.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Dict, List, Optional

import pytest
import requests
import yaml
from proxmoxer import ProxmoxAPI
from proxmoxer.tools import Tasks

from pve_lab.api import backend, daemon
from pve_lab.api.constants import DEFAULT_LAB_DIR, LabPaths

PATHS = LabPaths(DEFAULT_LAB_DIR)
LAB_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TASK_TIMEOUT = 300


@dataclass
class Lab:
    conn: Dict[str, object]
    backend: str
    started_here: bool
    backend_error: Optional[str]

    @property
    def has_guests(self) -> bool:
        return self.backend == "nodes"


def _pve_lab(*args: str) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([LAB_ROOT, os.environ.get("PYTHONPATH", "")]))
    subprocess.run([sys.executable, "-m", "pve_lab", *args], check=True, env=env)


@pytest.fixture(scope="session")
def lab():
    backend_error = None
    try:
        backend.node_backend_class()
    except ImportError as err:
        backend_error = str(err)
    wanted = "no-nodes" if backend_error or os.environ.get("LLMGW_LAB_NO_NODES") == "1" else "nodes"
    info = daemon.lab_info(PATHS)
    started = False
    if info is None or info.get("backend") != wanted or not os.path.exists(PATHS.connection_file):
        _pve_lab("up", *(["--no-nodes"] if wanted == "no-nodes" else []))
        started = info is None
        info = daemon.lab_info(PATHS)
    with open(PATHS.connection_file) as handle:
        conn = yaml.safe_load(handle)
    yield Lab(conn, info["backend"], started, backend_error)
    if started and os.environ.get("LLMGW_LAB_KEEP") != "1":
        _pve_lab("down")


@pytest.fixture
def needs_guest(lab):
    """Skips a test that needs a real guest (a booted node, its agent) when the lab has none."""
    if not lab.has_guests:
        reason = lab.backend_error or "LLMGW_LAB_NO_NODES=1"
        pytest.skip("the lab runs without the node backend (VMs have no guest): %s" % reason)


@pytest.fixture(scope="session")
def conn(lab):
    return lab.conn


def token_client(conn) -> ProxmoxAPI:
    user, token = str(conn["api_token_id"]).split("!")
    return ProxmoxAPI(conn["api_host"], port=conn["api_port"], user=user, token_name=token,
                      token_value=conn["api_token_secret"], verify_ssl=conn["ca_cert"], timeout=60)


@pytest.fixture(scope="session")
def api(conn):
    """proxmoxer with the API token, verifying the lab's CA."""
    return token_client(conn)


@pytest.fixture(scope="session")
def ticket_api(conn):
    """proxmoxer with ticket login (root@pam and password), verifying the lab's CA."""
    return ProxmoxAPI(conn["api_host"], port=conn["api_port"], user=conn["api_user"],
                      password=conn["api_password"], verify_ssl=conn["ca_cert"], timeout=60)


@pytest.fixture(scope="session")
def node(api, conn):
    return api.nodes(conn["pve_node"])


class Http:
    """Raw HTTPS calls, for what proxmoxer hides: status, reason phrase, headers and body."""

    def __init__(self, conn):
        self.conn = conn
        self.base = "https://%s:%d" % (conn["api_host"], conn["api_port"])

    def token_headers(self) -> Dict[str, str]:
        return {"Authorization": "PVEAPIToken=%s=%s" % (self.conn["api_token_id"], self.conn["api_token_secret"])}

    def request(self, method: str, path: str, headers: Optional[Dict[str, str]] = None, **kwargs):
        return requests.request(method, self.base + path, headers=headers or {}, verify=self.conn["ca_cert"],
                                timeout=60, **kwargs)

    def api(self, method: str, path: str, **kwargs):
        """A call to /api2/json with the API token."""
        return self.request(method, "/api2/json" + path, headers=self.token_headers(), **kwargs)

    def login(self) -> Dict[str, str]:
        answer = self.request("POST", "/api2/json/access/ticket",
                              data={"username": self.conn["api_user"], "password": self.conn["api_password"]})
        answer.raise_for_status()
        return answer.json()["data"]


@pytest.fixture(scope="session")
def http(conn):
    return Http(conn)


class Faults:
    """Switches the lab's faults (POST /lab/faults); after the test it switches off what it switched on, and
    only that, since other clients may use the lab at the same time."""

    def __init__(self, conn):
        self.url = "https://%s:%d/lab/faults" % (conn["api_host"], conn["api_port"])
        self.ca = conn["ca_cert"]
        self.switched: List[dict] = []
        self.locked: List[int] = []

    def _call(self, method: str, payload: Optional[dict] = None) -> dict:
        answer = requests.request(method, self.url, json=payload, verify=self.ca, timeout=30)
        answer.raise_for_status()
        return answer.json()["data"]

    def set(self, **payload) -> dict:
        if isinstance(payload.get("lock"), dict):
            self.locked.append(int(payload["lock"]["vmid"]))
        self.switched.append(payload)
        return self._call("POST", payload)

    def lock(self, vmid: int, lock: Optional[str]) -> dict:
        return self.set(lock={"vmid": vmid, "lock": lock})

    def state(self) -> dict:
        return self._call("GET")

    def clear(self) -> None:
        for payload in self.switched:
            off: Dict[str, object] = {}
            task = payload.get("fail_next_task")
            if task is not None:
                off["fail_next_task"] = task["message"] if isinstance(task, dict) else task
            if "fail_requests" in payload:
                off["fail_requests"] = True
            if "task_delay" in payload:
                off["task_delay"] = True
            if "slow_requests" in payload:
                off["slow_requests"] = True
            if "reset_requests" in payload:
                off["reset_requests"] = True
            if "ticket_lifetime" in payload:
                off["ticket_lifetime"] = True
            if off:
                self._call("DELETE", off)
        for vmid in self.locked:
            requests.post(self.url, json={"lock": {"vmid": vmid, "lock": None}}, verify=self.ca, timeout=30)
        self.switched, self.locked = [], []


@pytest.fixture
def faults(conn):
    helper = Faults(conn)
    yield helper
    helper.clear()


def wait(api, upid: str, timeout: float = TASK_TIMEOUT) -> dict:
    """proxmoxer.tools.Tasks.blocking_status, polling fast; fails the test when the task does not end."""
    status = Tasks.blocking_status(api, upid, timeout=timeout, polling_interval=0.2)
    assert status is not None, "task %s did not end within %s s" % (upid, timeout)
    return status


def wait_ok(api, upid: str, timeout: float = TASK_TIMEOUT) -> dict:
    status = wait(api, upid, timeout)
    assert status["exitstatus"] == "OK", status
    return status


class TaskWaiter:
    def __init__(self, api):
        self.api = api

    def wait(self, upid: str, timeout: float = TASK_TIMEOUT) -> dict:
        """The task's final status, whatever it is."""
        return wait(self.api, upid, timeout)

    def ok(self, upid: str, timeout: float = TASK_TIMEOUT) -> dict:
        """The task's final status, which must be OK."""
        return wait_ok(self.api, upid, timeout)


@pytest.fixture(scope="session")
def tasks(api):
    return TaskWaiter(api)


class VMs:
    """Creates and clones VMs through the API and destroys them (stopped, unlocked) after the test."""

    def __init__(self, api, node, conn):
        self.api, self.node, self.conn = api, node, conn
        self.made: List[int] = []

    def free_id(self) -> int:
        return int(self.api.cluster.nextid.get())

    def track(self, vmid: int) -> int:
        self.made.append(vmid)
        return vmid

    def clone(self, source: Optional[int] = None, **params) -> int:
        newid = params.pop("newid", None) or self.free_id()
        self.track(newid)
        wait_ok(self.api, self.node.qemu(source or self.conn["template_vmid"]).clone.post(newid=newid, **params))
        return newid

    def create(self, **params) -> int:
        vmid = params.pop("vmid", None) or self.free_id()
        self.track(vmid)
        wait_ok(self.api, self.node.qemu.create(vmid=vmid, **params))
        return vmid

    def cleanup(self) -> None:
        existing = {vm["vmid"] for vm in self.api.cluster.resources.get(type="vm")}
        for vmid in reversed(self.made):
            if vmid not in existing:
                continue
            wait(self.api, self.node.qemu(vmid).status.stop.post())
            wait(self.api, self.node.qemu(vmid).delete(purge=1))


@pytest.fixture
def vms(api, node, conn, faults):
    helper = VMs(api, node, conn)
    yield helper
    faults.clear()
    helper.cleanup()
