"""Running real ansible-playbook against this collection from tests."""

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.dirname(sys.executable)


def ansible_env(**extra):
    env = dict(os.environ)
    env.update(
        ANSIBLE_COLLECTIONS_PATH=os.path.join(REPO, ".build", "collections"),
        ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json",
        ANSIBLE_LOCALHOST_WARNING="False",
        ANSIBLE_INVENTORY_UNPARSED_WARNING="False",
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_PYTHON_INTERPRETER=sys.executable,
    )
    env.update(extra)
    return env


class PlaybookRun:
    def __init__(self, proc):
        self.rc = proc.returncode
        self.stderr = proc.stderr
        try:
            self.report = json.loads(proc.stdout[proc.stdout.index("{"):])
        except ValueError:
            raise AssertionError("ansible-playbook printed no JSON report:\n" + proc.stdout + proc.stderr)

    @property
    def stats(self):
        return next(iter(self.report["stats"].values()))

    @property
    def changed(self):
        return self.stats["changed"]

    @property
    def failed(self):
        return self.stats["failures"] > 0 or self.rc != 0

    def results(self, task_name):
        """Results of the task with this name (every host), in play order."""
        found = []
        for play in self.report["plays"]:
            for task in play["tasks"]:
                if task["task"]["name"] == task_name:
                    found.extend(task["hosts"].values())
        return found

    def failure_messages(self):
        messages = []
        for play in self.report["plays"]:
            for task in play["tasks"]:
                for result in task["hosts"].values():
                    if result.get("failed"):
                        messages.append(result.get("msg", ""))
                    elif result.get("unreachable"):
                        messages.append("unreachable at %r: %s" % (task["task"]["name"], result.get("msg", "")))
        return messages


def run_playbook(playbook, extra_vars=None, check=False, diff=False, inventory="localhost,", env=None, cwd=REPO,
                 extra_args=()):
    """``inventory`` is one source or a list of them (``-i`` each)."""
    inventories = [inventory] if isinstance(inventory, str) else list(inventory)
    argv = [os.path.join(BIN, "ansible-playbook")]
    for source in inventories:
        argv += ["-i", source]
    argv += [playbook] + list(extra_args)
    if extra_vars:
        argv += ["-e", json.dumps(extra_vars)]
    if check:
        argv.append("--check")
    if diff:
        argv.append("--diff")
    proc = subprocess.run(argv, capture_output=True, text=True, env=ansible_env(**(env or {})), cwd=cwd, check=False)
    return PlaybookRun(proc)


def write_destroy_playbook(path, names):
    """A playbook at ``path`` that destroys the lab VMs named (each absent already is left so) through pve_vm."""
    with open(path, "w") as handle:
        handle.write(
            "- hosts: localhost\n  gather_facts: false\n"
            "  module_defaults:\n    group/llmgw.fleet.proxmox: '{{ fleet_proxmox }}'\n"
            "  tasks:\n    - name: Destroy the test's VMs\n      llmgw.fleet.pve_vm:\n"
            "        name: '{{ item }}'\n        state: absent\n      loop: %s\n" % json.dumps(list(names)))
    return path


def free_ports(count=1):
    """``count`` distinct free TCP ports on 127.0.0.1, held open together while they are picked: one at a time,
    the kernel may hand out the port just released twice (a gateway's API and metrics port were once the same)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _sock in range(count)]
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in socks]


class ScratchGateway:
    """A gateway of a test's or a bench's own, as inventories/lab runs one (roles/gateway with
    gateway_service_manager: process, on loopback) but with its files, ports and key under ``directory``: ``vars``
    go into the extra vars of every playbook that should keep it in step; :meth:`stop` ends its HAProxy master."""

    def __init__(self, directory, key_name="test"):
        self.key = "sk-%s-%s" % (key_name, secrets.token_hex(16))
        self.port, metrics_port = free_ports(2)
        self.pid_file = os.path.join(directory, "haproxy.pid")
        self.stats_socket = os.path.join(directory, "admin.sock")
        self.vars = {
            "fleet_gateway_api_keys": {key_name: self.key}, "gateway_port": self.port,
            "gateway_metrics_port": metrics_port, "gateway_config_path": os.path.join(directory, "haproxy.cfg"),
            "gateway_keys_path": os.path.join(directory, "api-keys.map"),
            "gateway_targets_path": os.path.join(directory, "targets.json"),
            "gateway_stats_socket": self.stats_socket, "gateway_pid_file": self.pid_file}

    def stop(self):
        try:
            with open(self.pid_file) as handle:
                os.kill(int(handle.read().split()[0]), signal.SIGTERM)
        except (OSError, ValueError, IndexError):
            pass


def gateway_server_states(socket_path):
    """{(backend, server): status} from a gateway's runtime API (``show stat`` on its stats socket)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(5)
        sock.connect(socket_path)
        sock.sendall(b"show stat\n")
        data = b"".join(iter(lambda: sock.recv(65536), b"")).decode()
    lines = data.splitlines()
    header = lines[0].lstrip("# ").split(",")
    rows = [dict(zip(header, line.split(","))) for line in lines[1:] if line]
    return {(row["pxname"], row["svname"]): row["status"] for row in rows}
