"""add_node on the lab: from nothing to a ready node, against the lab's own floor, at 1, 8 and 16 nodes.

    .venv/bin/python tests/bench/bench_add_node.py [--quick] [--json PATH]

Figures, each beside its baseline from the same run:

* one node, ``playbooks/add_node.yml`` from nothing to ready, against the floor: the lab's own clone -> configure
  -> start -> ssh answers with cloud-init done for the same VM, by plain API calls and ssh (no Ansible, no checks);
* 8 and 16 nodes added by one add_node run over an inventory (one fork per node), as a ratio to one node (1.0 is
  perfect parallelism) and to the lab's floor for as many clones at once;
* for 8 and 16 nodes, what the whole run cost the machine (/proc/stat busy CPU-seconds) per node, against one
  node's: on the lab the controller and the nodes share the same cores, so this says how short a wide run can be;
* the idempotent re-run of the same node as a ratio to the first run;
* the speed probe's own seconds (profile_tasks on the first run) as a share of that run.

Until playbooks/add_node.yml exists the bench says so and measures ``playbooks/provision_node.yml`` (the
hypervisor half of add_node) in the same way, so the machinery is proven. The bench's VMs are named bench-<octet>
(octets 190-199: VMIDs 1190-1199) and removed after each step; controller-side state (known_hosts, CA, registry)
goes to a temporary directory, never the lab's .lab/fleet/. The lab is used as found (LLMGW_LAB_KEEP is implied).
``--quick`` measures the floor, one node and its re-run.
"""

import glob
import os
import re
import sys
import tempfile
import threading
import time

import yaml
from figures import REPO, lab_engine, log
from lab import LAB_DIR, LAB_INVENTORY, OCTETS, Lab, PlaybookFailed, busy_seconds, lab_main, run_playbook

ADD_NODE = os.path.join(REPO, "playbooks", "add_node.yml")
PROVISION_NODE = os.path.join(REPO, "playbooks", "provision_node.yml")
PROVISION_MANY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "playbooks", "provision_many.yml")
FIRST_OCTET = 190
FABRIC = "bench-a"


def controller_vars(state_dir):
    """Extra vars that keep every controller-side file of the run under ``state_dir``; the fleet CA is shared by
    every step of the bench (created once by the first run, as on a real controller)."""
    return {"lab_state_dir": LAB_DIR, "fleet_known_hosts_file": os.path.join(state_dir, "known_hosts"),
            "fleet_ca_dir": os.path.join(os.path.dirname(state_dir), "ca"),
            "fleet_registry": os.path.join(state_dir, "fleet.db")}


def known_names(state_dir):
    """The names with a host key in any known_hosts file of the run."""
    names = set()
    for path in glob.glob(os.path.join(state_dir, "known_hosts*")):
        with open(path) as handle:
            names |= {line.split()[0] for line in handle if line.strip() and not line.startswith("#")}
    return names


def own_known_hosts(state_dir, octet):
    """One known_hosts file per node when nodes are added at once: wait_for_node reads the fleet's known_hosts
    before it waits and writes it back after, so concurrent runs sharing one file lose each other's keys (and
    then fail their strict ssh check)."""
    return os.path.join(state_dir, "known_hosts.%d" % octet)


class Target:
    """The playbook measured: add_node.yml, or provision_node.yml while add_node does not exist."""

    def __init__(self, lab, tmp):
        self.lab, self.tmp = lab, tmp
        self.add_node = os.path.exists(ADD_NODE)
        self.playbook = ADD_NODE if self.add_node else PROVISION_NODE
        self.label = "add_node" if self.add_node else "provision_node (add_node's hypervisor half)"
        self.runs = 0
        self.engine = {}
        if self.add_node:
            engine = lab_engine()
            self.engine = {"fleet_engine_archive": engine["archive"], "fleet_engine_archive_sha256": engine["sha256"]}

    def node_vars(self, octet):
        values = dict(self.engine, node=self.lab.name(octet), address=self.lab.address(octet) + "/24")
        if self.add_node:
            values["fabric"] = FABRIC
        return values

    def log_path(self, what):
        self.runs += 1
        return os.path.join(self.tmp, "%02d-%s.log" % (self.runs, what))

    def one(self, octet, state_dir, known_hosts=None, env=None):
        extra = dict(controller_vars(state_dir), **self.node_vars(octet))
        if known_hosts:
            extra["fleet_known_hosts_file"] = known_hosts
        self.last_log = self.log_path("one-%d" % octet)
        return run_playbook(self.playbook, [LAB_INVENTORY], extra, self.last_log, env=env)

    def many(self, octets, state_dir):
        """Every node in one run: provision_many.yml with one fork per node for provision_node; add_node.yml
        runs one node per ansible-playbook (its interface names one node), so N runs start at once."""
        if not self.add_node:
            inventory = os.path.join(state_dir, "bench_nodes.yml")
            hosts = {self.lab.name(o): {"bench_address": self.lab.address(o) + "/24",
                                        "fleet_known_hosts_file": own_known_hosts(state_dir, o)} for o in octets}
            with open(inventory, "w") as handle:
                yaml.safe_dump({"bench_nodes": {"hosts": hosts}}, handle)
            extra = controller_vars(state_dir)
            del extra["fleet_known_hosts_file"]  # each host's own, from the inventory
            return run_playbook(PROVISION_MANY, [LAB_INVENTORY, inventory], extra,
                                self.log_path("many-%d" % len(octets)), forks=len(octets)), "--forks %d" % len(octets)
        inventory = os.path.join(state_dir, "bench_fleet.yml")
        os.makedirs(state_dir, exist_ok=True)
        hosts = {self.lab.name(o): {"fleet_address": self.lab.address(o) + "/24"} for o in octets}
        with open(inventory, "w") as handle:
            yaml.safe_dump({"fleet": {"vars": {"fleet_fabric": FABRIC}, "hosts": hosts}}, handle)
        extra = dict(controller_vars(state_dir), **self.engine)
        return run_playbook(self.playbook, [LAB_INVENTORY, inventory], extra, self.log_path("many-%d" % len(octets)),
                            forks=len(octets)), "one add_node run, --forks %d" % len(octets)


def main(argv=None):
    return lab_main(__doc__, "add_node", "add_node", "the floor, one node and its re-run only", run, argv)


def run(report, quick):
    lab = Lab()
    counts = [] if quick else [1, 8, 16]
    if not os.path.exists(ADD_NODE):
        report.skip("add_node", "playbooks/add_node.yml missing; measuring playbooks/provision_node.yml instead")
    lab.remove()  # what an interrupted earlier run left
    with tempfile.TemporaryDirectory(prefix="bench-add-node-") as tmp:
        target = Target(lab, tmp)
        try:
            measure(report, lab, target, tmp, counts)
        except PlaybookFailed as exc:
            print(str(exc), flush=True)
            report.skip(target.label, "a run failed: " + str(exc).splitlines()[0])
        finally:
            lab.remove()


def measure(report, lab, target, tmp, counts):
    octet, name = FIRST_OCTET, lab.name(FIRST_OCTET)
    floor = lab.clone_start_to_ssh(octet)
    log("floor: clone -> start -> ssh with cloud-init done for %s: %.1f s" % (name, floor))
    lab.remove([name])

    state = os.path.join(tmp, "one")
    # profile_tasks prints each task's time at the end of the log: the speed probe's share of the first run.
    busy = busy_seconds()
    first = target.one(octet, state, env={"ANSIBLE_CALLBACKS_ENABLED": "ansible.posix.profile_tasks"})
    cpu = {1: busy_seconds() - busy}
    log("%s %s from nothing: %.1f s" % (target.label, name, first))
    probe = task_seconds(target.last_log, SPEED_PROBE_TASK)
    again = target.one(octet, state)
    log("%s %s again (nothing to do): %.1f s" % (target.label, name, again))
    lab.remove([name])
    params = "1 node (cpu host, 4 cores, 4 GiB), lab nspawn node, %s" % os.path.basename(target.playbook)
    report.add("%s: 1 node, nothing to ready vs lab floor" % target.label, "%.1f s" % first,
               "floor %.1f s" % floor, first / floor, params,
               "%.1f s of the %.1f s are the collection's own (%s); the rest is the lab's floor"
               % (first - floor, first, "Ansible, host key, engine install, checks, certificate, registry"
                  if target.add_node else "Ansible, checks, host key"))
    if probe is not None:
        report.add("%s: the speed probe's share of 1 node" % target.label, "%.1f s" % probe,
                   "1 node %.1f s" % first, probe / first, params + ", llama-bench -p 128 -n 32 -r 2, twice",
                   "the probe (its model written, the picked backend and x64 measured) costs %.1f s of the %.1f s; "
                   "the goal is under 3 s" % (probe, first))
    report.add("%s: idempotent re-run vs first run" % target.label, "%.1f s" % again, "first %.1f s" % first,
               again / first, params, "a second run on a ready node costs %.0f%% of the first" % (100 * again / first))

    walls = {1: first} if target.add_node else {}
    for count in counts:
        if count in walls:
            continue  # add_node's one-node run above is the same command
        octets = OCTETS[:count]
        state = os.path.join(tmp, "many-%d" % count)
        busy = busy_seconds()
        try:
            walls[count], how = target.many(octets, state)
        except PlaybookFailed as exc:  # the other counts are still measured
            print(str(exc), flush=True)
            report.skip("%s: %d nodes in one run" % (target.label, count), "the run failed: " +
                        str(exc).splitlines()[0])
            lab.remove([lab.name(o) for o in octets])
            continue
        cpu[count] = busy_seconds() - busy
        learned = known_names(state)
        missing = sorted({lab.name(o) for o in octets} - learned)
        log("%d node(s) in one run (%s): %.1f s; known_hosts holds %d of %d%s" % (
            count, how, walls[count], len(learned & {lab.name(o) for o in octets}), count,
            (" (missing: %s)" % ", ".join(missing)) if missing else ""))
        if missing:
            report.skip("%d nodes: every host key kept" % count, "known_hosts lost %s: concurrent writers" %
                        ", ".join(missing))
        lab.remove([lab.name(o) for o in octets])
        if count > 1:
            report.add("%s: %d nodes in one run vs 1 node" % (target.label, count), "%.1f s" % walls[count],
                       "1 node %.1f s" % walls[1], walls[count] / walls[1],
                       "%d nodes, %s, one known_hosts for all, 2 cores" % (count, how),
                       "%d nodes take %.1fx one node's time (1.0 = fully parallel, %d = one after another)"
                       % (count, walls[count] / walls[1], count))
            floor_many = parallel_floor(lab, octets)
            report.add("%s: %d nodes in one run vs the lab floor for %d clones at once" % (target.label, count, count),
                       "%.1f s" % walls[count], "floor %.1f s" % floor_many, walls[count] / floor_many,
                       "%d clones of one template started at once, each waited to ssh with cloud-init done" % count,
                       "%.1f s of the %.1f s are the collection's own at this width"
                       % (walls[count] - floor_many, walls[count]))
            report_cpu(report, target.label, count, walls, cpu)


def report_cpu(report, label, count, walls, cpu):
    """What the whole run cost the machine per node, against one node's: on the lab the controller and every node
    share the same cores, so a wide run cannot end before its CPU-seconds over the cores."""
    cores = os.cpu_count() or 1
    per_node = cpu[count] / count
    least = cpu[count] / cores
    report.add("%s: %d nodes in one run, the machine's CPU per node vs 1 node's" % (label, count),
               "%.1f CPU-s a node" % per_node, "1 node %.1f CPU-s" % cpu[1], per_node / cpu[1],
               "/proc/stat busy time (all %d cores: ansible-playbook, the lab's API and the nodes, which share them)"
               % cores,
               "the %d-node run kept the cores %.0f%% busy; at this cost %d nodes need at least %.0f s on %d cores "
               "(%.1fx one node's %.1f s): within 2.5x of one node here needs at most %.1f CPU-s a node"
               % (count, 100 * cpu[count] / (cores * walls[count]), count, least, cores, least / walls[1], walls[1],
                  2.5 * walls[1] * cores / count))


SPEED_PROBE_TASK = "Measure the node's speed against its own scalar baseline"


def task_seconds(log_path, task):
    """The seconds profile_tasks printed for the task whose name starts with ``task`` (None when it did not run)."""
    with open(log_path) as handle:
        for line in handle:
            if task in line:
                match = re.search(r"(\d+\.\d+)s\s*$", line)
                if match:
                    return float(match.group(1))
    return None


def parallel_floor(lab, octets):
    """The lab's own floor for len(octets) nodes at once: clone -> configure -> start -> ssh, all side by side."""
    errors = []

    def one(octet):
        try:
            lab.clone_start_to_ssh(octet)
        except Exception as exc:  # reported below, the bench goes on without this figure
            errors.append("%s: %s" % (lab.name(octet), exc))

    started = time.monotonic()
    threads = [threading.Thread(target=one, args=(o,)) for o in octets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.monotonic() - started
    lab.remove([lab.name(o) for o in octets])
    if errors:
        raise PlaybookFailed("the parallel floor failed: " + errors[0])
    log("floor: %d clones at once -> ssh with cloud-init done: %.1f s" % (len(octets), seconds))
    return seconds


if __name__ == "__main__":
    sys.exit(main())
