"""A VM of any CPU model but `host`: a real QEMU guest under TCG with the `-cpu` Proxmox VE would give it.

KVM exists on this machine but its guests hang, hence `-accel tcg`. The `-cpu` string follows qemu-server's
PVE/QemuServer/CPUConfig.pm (builtin models x86-64-v2..v4 are qemu64 plus flags; kvm64 gets +lahf_lm,+sep),
less the KVM paravirt flags TCG has no use for, plus xsaveopt wherever xsave is on (see cpu_argument),
and always with `enforce`: a flag TCG cannot provide fails the
start instead of being dropped, so a guest never believes it has a feature it lacks, nor silently loses one.

The guest boots the template's own cloud kernel directly (-kernel/-initrd) from a qcow2 overlay of the
template's ext4 image, with its NoCloud seed on an ISO labelled cidata at ide2, as PVE attaches it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from typing import Any, Dict, List, Optional

from pve_lab.nodes import cloudinit, network
from pve_lab.nodes.common import LabError, is_alive, kill, lab_processes, run, spawn, terminate, wait_gone
from pve_lab.nodes.spec import VMSpec, cpu_options
from pve_lab.nodes.template import Template

ROLE = "qemu"

BUILTIN_MODELS = {
    "x86-64-v2": "+popcnt;+pni;+sse4.1;+sse4.2;+ssse3",
    "x86-64-v2-AES": "+aes;+popcnt;+pni;+sse4.1;+sse4.2;+ssse3",
    "x86-64-v3": "+aes;+popcnt;+pni;+sse4.1;+sse4.2;+ssse3;+avx;+avx2;+bmi1;+bmi2;+f16c;+fma;+abm;+movbe;+xsave",
    "x86-64-v4": "+aes;+popcnt;+pni;+sse4.1;+sse4.2;+ssse3;+avx;+avx2;+bmi1;+bmi2;+f16c;+fma;+abm;+movbe;+xsave;"
                 "+avx512f;+avx512bw;+avx512cd;+avx512dq;+avx512vl",
}
# the flags PVE lets a VM config set itself (CPUConfig.pm, $cpu_flag_supported_re)
VM_SETTABLE_FLAGS = {"pcid", "spec-ctrl", "ibpb", "ssbd", "virt-ssbd", "amd-ssbd", "amd-no-ssb", "pdpe1gb",
                     "md-clear", "hv-tlbflush", "hv-evmcs", "aes"}


def _flag_list(flags: Optional[str], allowed: Optional[set] = None) -> Dict[str, str]:
    result = {}
    for flag in (flags or "").split(";"):
        if len(flag) > 1 and flag[0] in "+-" and (allowed is None or flag[1:] in allowed):
            result[flag[1:]] = flag[0]
    return result


def cpu_argument(cpu: Optional[str]) -> str:
    """The `-cpu` value for a PVE `cpu` setting (None: PVE's default, kvm64)."""
    options = cpu_options(cpu)
    model = options.get("cputype", "kvm64")
    if model == "host":
        raise LabError("cpu host runs as a container, not under TCG")
    flags: Dict[str, str] = {}
    if model in ("kvm64", "kvm32"):
        flags["sep"] = "+"
    if model == "kvm64":
        flags["lahf_lm"] = "+"
    if model in BUILTIN_MODELS:
        flags.update(_flag_list(BUILTIN_MODELS[model]))
        model = "qemu64"
    flags.update(_flag_list(options.get("flags"), VM_SETTABLE_FLAGS))
    if flags.get("xsave") == "+":
        # QEMU 7.2's TCG hangs the guest kernel when it sets CR4.OSXSAVE on a CPU that has XSAVE but not
        # XSAVEOPT (seen here with x86-64-v3; hermit-os/kernel#273 hit the same). KVM guests of these models do
        # without it; under TCG the guest gets the real instruction, one flag more than on PVE, none of which
        # llama.cpp's variant selection reads.
        flags["xsaveopt"] = "+"
    return ",".join([model] + ["%s%s" % (flags[name], name) for name in sorted(flags)] + ["enforce"])


def _paths(node_dir: str) -> Dict[str, str]:
    names = ("disk.qcow2", "cloudinit.iso", "console.log", "qemu.log", "qmp.sock", "qga.sock", "qemu.pid")
    return {name: os.path.join(node_dir, name) for name in names}


def build_argv(spec: VMSpec, node_dir: str, template: Template, tap: str) -> List[str]:
    p = _paths(node_dir)
    cores = max(1, spec.cores)
    argv = [
        "qemu-system-x86_64", "-name", "llmgw-%d,debug-threads=on" % spec.vmid, "-no-user-config", "-nodefaults",
        "-machine", "pc", "-accel", "tcg",
        "-smp", "%d,sockets=1,cores=%d,maxcpus=%d" % (cores, cores, cores), "-m", str(max(64, spec.memory)),
        "-display", "none", "-rtc", "base=utc",
        "-serial", "file:%s" % p["console.log"],
        "-qmp", "unix:%s,server=on,wait=off" % p["qmp.sock"], "-pidfile", p["qemu.pid"],
        "-netdev", "tap,id=net0,ifname=%s,script=no,downscript=no" % tap,
        "-device", "virtio-net-pci,netdev=net0,mac=%s,romfile=" % cloudinit.mac_of(spec),
    ]
    if spec.agent:
        argv += [
            "-chardev", "socket,path=%s,server=on,wait=off,id=qga0" % p["qga.sock"],
            "-device", "virtio-serial,id=qga0-bus",
            "-device", "virtserialport,chardev=qga0,name=org.qemu.guest_agent.0",
        ]
    if spec.has_os:
        argv += [
            "-cpu", cpu_argument(spec.cpu),
            "-kernel", template.kernel, "-initrd", template.initrd, "-append", "root=/dev/vda rw console=ttyS0",
            "-drive", "file=%s,format=qcow2,if=virtio,cache=writeback,discard=unmap" % p["disk.qcow2"],
            "-drive", "file=%s,format=raw,if=ide,index=2,media=cdrom,readonly=on" % p["cloudinit.iso"],
        ]
    else:
        # nothing to boot: the firmware finds no bootable device and retries forever, as on a real VM
        model = cpu_options(spec.cpu).get("cputype", "kvm64")
        argv += ["-cpu", "qemu64" if model == "host" else cpu_argument(spec.cpu)]
    return argv


def start(spec: VMSpec, node_dir: str, template: Template) -> int:
    os.makedirs(node_dir, exist_ok=True)
    p = _paths(node_dir)
    for stale in ("qmp.sock", "qga.sock", "qemu.pid"):
        if os.path.lexists(p[stale]):
            os.remove(p[stale])
    if spec.has_os:
        if not os.path.exists(p["disk.qcow2"]):
            run(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b", template.disk, p["disk.qcow2"]])
        cloudinit.write_seed_iso(spec, p["cloudinit.iso"])
    network.check_address(cloudinit.parse_ipconfig(spec.ipconfig0))
    tap = network.setup_tap(spec.vmid)
    argv = build_argv(spec, node_dir, template, tap)
    proc = spawn(argv, p["qemu.log"], ROLE, spec.vmid)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if wait_gone(proc.pid, 0.1):
            network.remove_tap(spec.vmid)
            with open(p["qemu.log"]) as log:
                tail = log.read()[-1500:]
            raise LabError("QEMU failed to start VM %d: %s" % (spec.vmid, tail.strip()))
        if os.path.exists(p["qmp.sock"]):
            return proc.pid
    stop(spec.vmid, node_dir)
    raise LabError("QEMU did not come up for VM %d (log %s)" % (spec.vmid, p["qemu.log"]))


def qemu_pid(vmid: int) -> Optional[int]:
    procs = lab_processes(role=ROLE, vmid=vmid)
    return procs[0].pid if procs else None


def is_running(vmid: int) -> bool:
    pid = qemu_pid(vmid)
    return pid is not None and is_alive(pid)


def agent_socket(node_dir: str) -> str:
    return _paths(node_dir)["qga.sock"]


def qmp(node_dir: str, execute: str, arguments: Optional[Dict[str, Any]] = None, timeout: float = 5.0) -> Any:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(_paths(node_dir)["qmp.sock"])
        stream = sock.makefile("rwb")
        json.loads(stream.readline())  # greeting
        for request in ({"execute": "qmp_capabilities"}, {"execute": execute, "arguments": arguments or {}}):
            stream.write(json.dumps(request).encode() + b"\n")
            stream.flush()
            while True:
                reply = json.loads(stream.readline())
                if "event" not in reply:
                    break
            if "error" in reply:
                raise LabError("QMP %s: %s" % (request["execute"], reply["error"].get("desc")))
        return reply.get("return")
    finally:
        sock.close()


def request_poweroff(node_dir: str) -> bool:
    """ACPI power button, as `qm shutdown` without the agent sends it."""
    try:
        qmp(node_dir, "system_powerdown")
        return True
    except (OSError, LabError, ValueError):
        return False


def stop(vmid: int, node_dir: str) -> None:
    for proc in lab_processes(role=ROLE, vmid=vmid):
        terminate(proc.pid, grace=5)
        if is_alive(proc.pid):
            kill(proc.pid, signal.SIGKILL)
    network.remove_tap(vmid)
