"""Names, paths and small process helpers shared by the node backend.

Everything the lab creates on the host carries the ``llmgw`` prefix (interfaces, network namespaces, overlay
mount sources) or an ``LLMGW_LAB_ROLE`` environment variable (processes), so that ``teardown_all`` can find it
again after a crash without any memory of what was started.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Sequence

LOG = logging.getLogger("pve_lab.nodes")

CACHE_DIR = "/var/cache/llmgw-lab"
# this file is tests/lab/pve_lab/nodes/common.py
REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, os.pardir, os.pardir))
DEFAULT_STATE_DIR = os.path.join(REPO_ROOT, ".lab")

BRIDGE = "llmgwbr0"
BRIDGE_ADDRESS = "10.77.0.254"
NETWORK_PREFIXLEN = 24
NETWORK = "10.77.0.0/24"
GATEWAY = "10.77.0.1"  # nothing answers it: nodes have a route, not a way out
MIRROR_PORT = 8099
MIRROR_URL = "http://%s:%d/" % (BRIDGE_ADDRESS, MIRROR_PORT)

NETNS_PREFIX = "llmgw-"
VETH_PREFIX = "llmgwv"
TAP_PREFIX = "llmgwt"
LINK_PREFIX = "llmgw"
MOUNT_SOURCE_PREFIX = "llmgw-"
ROLE_ENV = "LLMGW_LAB_ROLE"
VMID_ENV = "LLMGW_LAB_VMID"
PROXMOX_OUI = "bc:24:11"

SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class LabError(RuntimeError):
    """The lab could not do what was asked; the message says what and why."""


def netns_name(vmid: int) -> str:
    return "%s%d" % (NETNS_PREFIX, vmid)


def veth_name(vmid: int) -> str:
    return "%s%d" % (VETH_PREFIX, vmid)


def tap_name(vmid: int) -> str:
    return "%s%d" % (TAP_PREFIX, vmid)


def default_mac(vmid: int) -> str:
    """A stable address in Proxmox's OUI for a VM whose config names none."""
    return "%s:%02x:%02x:%02x" % (PROXMOX_OUI, (vmid >> 16) & 0xFF, (vmid >> 8) & 0xFF, vmid & 0xFF)


def run(argv: Sequence[str], check: bool = True, input_text: Optional[str] = None, timeout: float = 600,
        env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:
    """Run a host command, capturing its output; a failure raises LabError with the command's stderr."""
    LOG.debug("run: %s", " ".join(argv))
    proc = subprocess.run(list(argv), input=input_text, capture_output=True, text=True,
                          timeout=timeout, env=env, check=False)
    if check and proc.returncode != 0:
        raise LabError("%s failed (%d): %s" % (" ".join(argv), proc.returncode,
                                               (proc.stderr or proc.stdout).strip()[-2000:]))
    return proc


def lab_env(role: str, vmid: Optional[int] = None) -> Dict[str, str]:
    """The environment of a process the lab starts: a clean PATH plus the markers teardown finds it by."""
    env = {"PATH": SAFE_PATH, "LANG": "C.UTF-8", ROLE_ENV: role}
    if vmid is not None:
        env[VMID_ENV] = str(vmid)
    return env


@dataclass(frozen=True)
class LabProcess:
    pid: int
    role: str
    vmid: Optional[int]


def _read_environ(pid: int) -> Dict[str, str]:
    try:
        with open("/proc/%d/environ" % pid, "rb") as handle:
            raw = handle.read()
    except OSError:
        return {}
    env = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            env[key.decode(errors="replace")] = value.decode(errors="replace")
    return env


def process_state(pid: int) -> Optional[str]:
    """The one-letter state of a process (R, S, Z...), None when it does not exist."""
    try:
        with open("/proc/%d/stat" % pid) as handle:
            return handle.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def is_alive(pid: int) -> bool:
    state = process_state(pid)
    return state is not None and state not in ("Z", "X")


def lab_processes(role: Optional[str] = None, vmid: Optional[int] = None) -> List[LabProcess]:
    """Live processes the lab started, found by their environment markers."""
    reap_children()
    found = []
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        pid = int(entry)
        env = _read_environ(pid)
        if ROLE_ENV not in env or not is_alive(pid):
            continue
        proc_vmid = int(env[VMID_ENV]) if env.get(VMID_ENV, "").isdigit() else None
        if role is not None and env[ROLE_ENV] != role:
            continue
        if vmid is not None and proc_vmid != vmid:
            continue
        found.append(LabProcess(pid, env[ROLE_ENV], proc_vmid))
    return found


def children(pid: int) -> Iterator[int]:
    try:
        with open("/proc/%d/task/%d/children" % (pid, pid)) as handle:
            for item in handle.read().split():
                yield int(item)
    except OSError:
        return


_CHILDREN: Dict[int, subprocess.Popen] = {}


def spawn(argv: Sequence[str], log_path: str, role: str, vmid: Optional[int] = None) -> subprocess.Popen:
    """Start a long-lived lab process in its own session, output appended to ``log_path``, marked for teardown."""
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    with open(log_path, "ab") as log:
        log.write(("\n# %s\n" % " ".join(argv)).encode())
        log.flush()
        proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                env=lab_env(role, vmid), start_new_session=True, cwd="/")
    _CHILDREN[proc.pid] = proc
    return proc


def reap_children() -> None:
    """Collect the lab processes of ours that ended, so that none lingers as a zombie."""
    for pid, proc in list(_CHILDREN.items()):
        if proc.poll() is not None:
            del _CHILDREN[pid]


def reap(pid: int) -> None:
    """Collect the exit status of ``pid`` if it is a child of ours that ended (a no-op otherwise)."""
    proc = _CHILDREN.get(pid)
    if proc is not None:
        if proc.poll() is not None:
            del _CHILDREN[pid]
        return
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        reap(pid)
        if not is_alive(pid):
            return True
        time.sleep(0.05)
    return not is_alive(pid)


def kill(pid: int, sig: int = signal.SIGKILL) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def terminate(pid: int, grace: float = 5.0) -> None:
    """SIGTERM, then SIGKILL after ``grace`` seconds; reaps the process when it is our child."""
    if not is_alive(pid):
        reap(pid)
        return
    kill(pid, signal.SIGTERM)
    if not wait_gone(pid, grace):
        kill(pid, signal.SIGKILL)
        wait_gone(pid, 5.0)


def mounts() -> List[Dict[str, str]]:
    """The host's mounts (from /proc/self/mountinfo): mount point, type, source and super options."""
    result = []
    with open("/proc/self/mountinfo") as handle:
        for line in handle:
            left, _ignored, right = line.partition(" - ")
            fields = left.split()
            rfields = right.split()
            result.append({
                "target": fields[4].encode().decode("unicode_escape"),
                "fstype": rfields[0] if rfields else "",
                "source": rfields[1] if len(rfields) > 1 else "",
                "options": rfields[2] if len(rfields) > 2 else "",
            })
    return result


def is_mounted(path: str) -> bool:
    path = os.path.realpath(path)
    return any(m["target"] == path for m in mounts())


def unmount(path: str) -> None:
    if not is_mounted(path):
        return
    if run(["umount", path], check=False).returncode != 0:
        run(["umount", "-l", path], check=False)


def write_file(path: str, content: str, mode: int = 0o644) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as handle:
        handle.write(content)
    os.chmod(tmp, mode)
    os.replace(tmp, path)
