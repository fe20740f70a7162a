"""`make lab-down` takes the lab fleet's state with its VMs: the registry, known_hosts and CA under .lab/fleet and
the gateway under .lab/gateway, whose HAProxy master (started by roles/gateway as a process: the controller has no
systemd) is stopped first. Kept, the registry would show nodes ``ready`` whose VMs no longer exist and refuse the
same names again as changed host keys. Runs on a scratch lab directory, never the lab's own."""

import os
import shutil
import socket
import subprocess
import time

import pytest

from pve_lab import cli
from pve_lab.api.constants import LabPaths

HAPROXY = shutil.which("haproxy") or ("/usr/sbin/haproxy" if os.path.exists("/usr/sbin/haproxy") else None)


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_the_fleet_state_goes_with_the_lab(tmp_path):
    paths = LabPaths(str(tmp_path))
    os.makedirs(os.path.join(paths.fleet_dir, "ca", "nodes", "node01"))
    for name in ("fleet.db", "known_hosts"):
        (tmp_path / "fleet" / name).write_text("x")
    os.makedirs(paths.gateway_dir)
    (tmp_path / "gateway" / "haproxy.cfg").write_text("x")
    (tmp_path / "api").mkdir()
    removed = cli.remove_fleet_state(paths)
    assert removed == [paths.fleet_dir, paths.gateway_dir]
    assert sorted(os.listdir(tmp_path)) == ["api"]  # the lab's own files are down()'s other steps
    assert cli.remove_fleet_state(paths) == []


def test_no_gateway_running_is_no_error(tmp_path):
    paths = LabPaths(str(tmp_path))
    assert cli.stop_gateway(paths) is None
    os.makedirs(paths.gateway_dir)
    (tmp_path / "gateway" / "haproxy.pid").write_text("%d\n" % os.getpid())  # a live process, not HAProxy
    assert cli.stop_gateway(paths) is None
    assert os.path.exists("/proc/%d" % os.getpid())


@pytest.mark.skipif(HAPROXY is None, reason="haproxy is not installed (tests/lab/apt-packages.txt)")
def test_the_gateway_master_is_stopped(tmp_path):
    paths = LabPaths(str(tmp_path))
    os.makedirs(paths.gateway_dir)
    config = tmp_path / "gateway" / "haproxy.cfg"
    config.write_text("global\n    maxconn 16\ndefaults\n    mode http\n    timeout connect 1s\n"
                      "    timeout client 1s\n    timeout server 1s\nfrontend f\n    bind 127.0.0.1:%d\n"
                      "    http-request return status 200\n" % free_port())
    pid_file = os.path.join(paths.gateway_dir, "haproxy.pid")
    subprocess.run([HAPROXY, "-W", "-D", "-p", pid_file, "-f", str(config)], check=True, timeout=20)
    with open(pid_file) as handle:
        master = int(handle.read().split()[0])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not os.path.exists("/proc/%d" % master):
        time.sleep(0.1)
    assert cli.stop_gateway(paths) == master
    assert not os.path.exists("/proc/%d" % master)
