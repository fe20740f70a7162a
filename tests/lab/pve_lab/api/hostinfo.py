"""What the lab's one node reports about itself: this machine's real CPU, memory, load and uptime."""

from __future__ import annotations

import os
import platform
from typing import Dict


def cpuinfo() -> Dict[str, object]:
    fields: Dict[str, str] = {}
    sockets = set()
    with open("/proc/cpuinfo") as handle:
        for line in handle:
            key, sep, value = line.partition(":")
            if not sep:
                continue
            key, value = key.strip(), value.strip()
            if key == "physical id":
                sockets.add(value)
            fields.setdefault(key, value)
    flags = fields.get("flags", "")
    cpus = os.cpu_count() or 1
    return {
        "cpus": cpus,
        "sockets": max(1, len(sockets)),
        "cores": int(fields.get("cpu cores", cpus)),
        "model": fields.get("model name", "unknown"),
        "mhz": fields.get("cpu MHz", "0"),
        "flags": flags,
        "hvm": "1" if (" vmx" in " " + flags or " svm" in " " + flags) else "0",
        "user_hz": 100,
    }


def meminfo() -> Dict[str, int]:
    values: Dict[str, int] = {}
    with open("/proc/meminfo") as handle:
        for line in handle:
            key, _ignored, rest = line.partition(":")
            values[key] = int(rest.split()[0]) * 1024
    return values


def memory() -> Dict[str, int]:
    info = meminfo()
    total, free = info["MemTotal"], info.get("MemAvailable", info["MemFree"])
    return {"total": total, "used": total - free, "free": free}


def swap() -> Dict[str, int]:
    info = meminfo()
    total, free = info.get("SwapTotal", 0), info.get("SwapFree", 0)
    return {"total": total, "used": total - free, "free": free}


def uptime() -> int:
    with open("/proc/uptime") as handle:
        return int(float(handle.read().split()[0]))


def loadavg():
    return ["%.2f" % value for value in os.getloadavg()]


def kernel() -> str:
    uname = platform.uname()
    return "%s %s %s" % (uname.system, uname.release, uname.version)
