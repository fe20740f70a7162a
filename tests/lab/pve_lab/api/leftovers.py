"""What the lab may leave on the host, found by looking (for `lab down --verify`).

Everything the lab makes carries the `llmgw` prefix (interfaces, network namespaces, mount sources) or the
LLMGW_LAB_ROLE environment marker (processes); the API server is found by its command line.
"""

from __future__ import annotations

import os
import subprocess
from typing import List

from pve_lab.api import daemon
from pve_lab.api.constants import LabPaths

PREFIX = "llmgw"
ROLE_MARKER = b"LLMGW_LAB_ROLE="
CACHE_DIR = "/var/cache/llmgw-lab"


def _marked_processes() -> List[str]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open("/proc/%s/environ" % entry, "rb") as handle:
                marked = any(item.startswith(ROLE_MARKER) for item in handle.read().split(b"\0"))
            with open("/proc/%s/stat" % entry) as handle:
                state = handle.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if marked and state not in ("Z", "X"):
            found.append("process %s (%s)" % (entry, " ".join(daemon._cmdline(int(entry)))[:80]))
    return found


def _ip(*argv: str) -> List[str]:
    result = subprocess.run(["ip", *argv], capture_output=True, text=True, check=False)
    return [line.split()[0] for line in result.stdout.splitlines() if line.split()]


def _mounts(paths: LabPaths) -> List[str]:
    found = []
    roots = (paths.lab_dir + os.sep, CACHE_DIR + os.sep, "/run/netns/" + PREFIX)
    with open("/proc/self/mountinfo") as handle:
        for line in handle:
            left, _ignored, right = line.partition(" - ")
            target = left.split()[4]
            source = right.split()[1] if len(right.split()) > 1 else ""
            if source.startswith(PREFIX + "-") or target.startswith(roots):
                found.append("mount %s (%s)" % (target, source))
    return found


def find(paths: LabPaths) -> List[str]:
    found = ["API server process %d" % pid for pid in daemon.server_pids(paths)]
    found += _marked_processes()
    found += ["interface %s" % name.split("@")[0] for name in _ip("-br", "link") if name.startswith(PREFIX)]
    found += ["network namespace %s" % name for name in _ip("netns", "list") if name.startswith(PREFIX)]
    found += _mounts(paths)
    for path in (paths.state_file, paths.tasks_file, paths.pid_file, paths.connection_file):
        if os.path.exists(path):
            found.append("file %s" % path)
    return found
