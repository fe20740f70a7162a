"""Starting, finding and stopping the API server process (a daemon with a pid file in `.lab/api/`)."""

from __future__ import annotations

import json
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import List, Optional

from pve_lab.api.constants import API_HOST, API_PORT, REPO_ROOT, TOKEN_ID, LabPaths
from pve_lab.api.credentials import load_or_create

SERVER_MODULE = "pve_lab.api.server"
MAX_LOG = 20 * 1024 * 1024
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _cmdline(pid: int) -> List[str]:
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as handle:
            return [part.decode(errors="replace") for part in handle.read().split(b"\0") if part]
    except OSError:
        return []


def _is_ours(pid: int, paths: LabPaths) -> bool:
    argv = _cmdline(pid)
    return SERVER_MODULE in argv and "--lab-dir" in argv and paths.lab_dir in argv


def server_pids(paths: LabPaths) -> List[int]:
    """The server processes of this lab: the pid file's, and any other found by command line (after a crash)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and _is_ours(int(entry), paths):
            pids.append(int(entry))
    return sorted(pids)


def _alive(pid: int) -> bool:
    try:
        with open("/proc/%d/stat" % pid) as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def start(paths: LabPaths, no_nodes: bool) -> int:
    os.makedirs(paths.api_dir, exist_ok=True)
    argv = [sys.executable, "-m", SERVER_MODULE, "--lab-dir", paths.lab_dir]
    if no_nodes:
        argv.append("--no-nodes")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([PACKAGE_ROOT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                                                          if p and p != PACKAGE_ROOT])
    if os.path.exists(paths.log_file) and os.path.getsize(paths.log_file) > MAX_LOG:
        os.replace(paths.log_file, paths.log_file + ".1")
    with open(paths.log_file, "ab") as log:
        proc = subprocess.Popen(argv, cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)
    with open(paths.pid_file, "w") as handle:
        handle.write("%d\n" % proc.pid)
    return proc.pid


def stop(paths: LabPaths, timeout: float = 10.0) -> List[int]:
    pids = server_pids(paths)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in pids:
        if _alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    if os.path.exists(paths.pid_file):
        os.unlink(paths.pid_file)
    return pids


def _ssl_context(paths: LabPaths) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=paths.ca_cert)


def api_get(paths: LabPaths, path: str, timeout: float = 5.0) -> object:
    """GET /api2/json{path} with the lab's token, verifying the lab's CA."""
    creds = load_or_create(paths)
    request = urllib.request.Request("https://%s:%d/api2/json%s" % (API_HOST, API_PORT, path), headers={
        "Authorization": "PVEAPIToken=%s=%s" % (TOKEN_ID, creds.token_secret)})
    with urllib.request.urlopen(request, timeout=timeout, context=_ssl_context(paths)) as response:
        return json.load(response)["data"]


def lab_info(paths: LabPaths, timeout: float = 5.0) -> Optional[dict]:
    """GET /lab/info, None when no lab server answers."""
    try:
        url = "https://%s:%d/lab/info" % (API_HOST, API_PORT)
        with urllib.request.urlopen(url, timeout=timeout, context=_ssl_context(paths)) as response:
            return json.load(response)["data"]
    except (OSError, ValueError, KeyError):
        return None


def wait_answering(paths: LabPaths, pid: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    error: object = None
    while time.monotonic() < deadline:
        if not _alive(pid):
            raise RuntimeError("the API server exited; see %s:\n%s" % (paths.log_file, log_tail(paths)))
        try:
            api_get(paths, "/version", timeout=2)
            return
        except (OSError, urllib.error.URLError, ValueError) as err:
            error = err
        time.sleep(0.2)
    raise RuntimeError("the API server did not answer within %.0f s (%s); see %s" % (timeout, error, paths.log_file))


def log_tail(paths: LabPaths, lines: int = 30) -> str:
    try:
        with open(paths.log_file, errors="replace") as handle:
            return "".join(handle.readlines()[-lines:])
    except OSError:
        return ""
