"""The lab's package mirror: a flat apt repository of real .debs, served on the bridge address only."""

from __future__ import annotations

import datetime
import gzip
import hashlib
import os
import socket
import sys
import time

from pve_lab.nodes.common import BRIDGE_ADDRESS, MIRROR_PORT, LabError, lab_processes, run, spawn, terminate

ROLE = "mirror"


def write_index(mirror_dir: str) -> None:
    """Packages, Packages.gz and an unsigned Release, as `deb [trusted=yes] URL ./` expects."""
    # run from the mirror directory so that each Filename is relative to it
    packages = run(["sh", "-c", 'cd "$1" && dpkg-scanpackages --multiversion . /dev/null', "-", mirror_dir],
                   timeout=300).stdout
    if "Package:" not in packages:
        raise LabError("dpkg-scanpackages found no package in %s" % mirror_dir)
    files = {"Packages": packages.encode()}
    files["Packages.gz"] = gzip.compress(files["Packages"], mtime=0)
    for name, data in files.items():
        with open(os.path.join(mirror_dir, name), "wb") as handle:
            handle.write(data)
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%a, %d %b %Y %H:%M:%S UTC")
    lines = ["Origin: llmgw-lab", "Label: llmgw-lab", "Date: %s" % date, "SHA256:"]
    for name, data in sorted(files.items()):
        lines.append(" %s %d %s" % (hashlib.sha256(data).hexdigest(), len(data), name))
    with open(os.path.join(mirror_dir, "Release"), "w") as handle:
        handle.write("\n".join(lines) + "\n")


def is_serving(timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((BRIDGE_ADDRESS, MIRROR_PORT), timeout=timeout):
            return True
    except OSError:
        return False


def ensure_serving(mirror_dir: str, log_path: str) -> None:
    """Start the mirror's HTTP server unless one is already up; it binds the bridge address only."""
    if lab_processes(role=ROLE) and is_serving():
        return
    stop()
    spawn([sys.executable, "-m", "http.server", str(MIRROR_PORT), "--bind", BRIDGE_ADDRESS, "--directory", mirror_dir],
          log_path, ROLE)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if is_serving():
            return
        time.sleep(0.1)
    raise LabError("the mirror did not start listening on %s:%d (log %s)" % (BRIDGE_ADDRESS, MIRROR_PORT, log_path))


def stop() -> None:
    for proc in lab_processes(role=ROLE):
        terminate(proc.pid, grace=3)
