"""The gateway's cost, on the lab: a 16-token completion from a real model asked through the gateway against the
same completion asked of the replica's leader directly, in the same run.

    .venv/bin/python tests/bench/bench_gateway.py [--quick] [--json PATH]

One lab node (bench-250) added with add_node.yml, Gemma 3 270M Q4_K_M (the model `make demo` serves, from PyPI)
placed on it with place_replica.yml, and the gateway (HAProxy from Debian, set up by playbooks/gateway.yml as a
process on loopback, files in a temporary directory) following the bench's registry. Then the same request --
``/v1/completions``, 16 tokens, temperature 0, one client -- alternately to the leader (``http://10.77.0.250:PORT``)
and to the gateway (``http://127.0.0.1:PORT`` with the API key), 60 pairs after 5 of warm-up (``--quick``: 8).
The figures are the p50 and p99 of the gateway's latency over the direct one's (goal: at most 1.1x at p50).
The VM, the registry and the gateway are removed at the end.
"""

import http.client
import json
import os
import sys
import tempfile
import time

from figures import REPO, lab_engine, lab_script, log
from lab import LAB_DIR, LAB_INVENTORY, Lab, PlaybookFailed, lab_main, run_playbook

sys.path.insert(0, os.path.join(REPO, "tests", "e2e"))
from helpers import ScratchGateway  # noqa: E402 - the tests' own gateway

from ansible_collections.llmgw.fleet.plugins.module_utils.fleet_registry import FleetRegistry

PLAYBOOKS = os.path.join(REPO, "playbooks")
OCTET = 250
REPLICA = "bench-gemma"
MODEL = "gemma3-270m"  # as inventories/lab declares it
TOKENS = 16


def percentile(values, share):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(share * (len(ordered) - 1))))]


def ask(host, port, key=None):
    """Seconds for one 16-token completion, checked: HTTP 200 and 16 tokens generated."""
    body = json.dumps({"model": MODEL, "prompt": "The three primary colors are", "max_tokens": TOKENS,
                       "temperature": 0, "ignore_eos": True})
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = "Bearer " + key
    started = time.perf_counter()
    conn = http.client.HTTPConnection(host, port, timeout=120)
    try:
        conn.request("POST", "/v1/completions", body=body, headers=headers)
        answer = conn.getresponse()
        data = answer.read()
    finally:
        conn.close()
    seconds = time.perf_counter() - started
    if answer.status != 200:
        raise RuntimeError("%s:%d answered %d: %s" % (host, port, answer.status, data[:300]))
    tokens = json.loads(data)["usage"]["completion_tokens"]
    if tokens != TOKENS:
        raise RuntimeError("%s:%d generated %d tokens, not %d" % (host, port, tokens, TOKENS))
    return seconds


def main(argv=None):
    return lab_main(__doc__, "gateway", "gateway latency", "8 pairs instead of 60", run, argv)


def run(report, quick):
    lab = Lab()
    name = lab.name(OCTET)
    lab.remove([name])
    with tempfile.TemporaryDirectory(prefix="bench-gateway-") as tmp:
        state = {"tmp": tmp, "gateway": ScratchGateway(os.path.join(tmp, "gateway"), "bench"), "runs": 0}
        try:
            measure(report, lab, state, 8 if quick else 60)
        except (PlaybookFailed, RuntimeError, OSError) as exc:
            print(str(exc), flush=True)
            report.skip("gateway latency", "a step failed: " + str(exc).splitlines()[0])
        finally:
            state["gateway"].stop()
            lab.remove([name])


def measure(report, lab, state, pairs):
    tmp = state["tmp"]
    engine = lab_engine()
    lab_script("real_model").assemble()
    key, port = state["gateway"].key, state["gateway"].port
    extra = dict(state["gateway"].vars, lab_state_dir=LAB_DIR, fleet_registry=os.path.join(tmp, "fleet.db"),
                 fleet_known_hosts_file=os.path.join(tmp, "known_hosts"), fleet_ca_dir=os.path.join(tmp, "ca"),
                 fleet_engine_archive=engine["archive"], fleet_engine_archive_sha256=engine["sha256"])

    def play(playbook, **more):
        state["runs"] += 1
        log_path = os.path.join(tmp, "%02d-%s.log" % (state["runs"], playbook[:-4]))
        return run_playbook(os.path.join(PLAYBOOKS, playbook), [LAB_INVENTORY], dict(extra, **more), log_path)

    began = time.monotonic()
    play("gateway.yml")
    play("add_node.yml", node=lab.name(OCTET), address=lab.address(OCTET) + "/24", fabric="bench-a")
    play("place_replica.yml", replica=REPLICA, model=MODEL)
    with FleetRegistry(extra["fleet_registry"]) as registry:
        replica = registry.get_replica(REPLICA)
    if (replica or {}).get("state") != "ready":
        raise RuntimeError("%s is %s after place_replica, not ready" % (REPLICA, (replica or {}).get("state")))
    leader = (replica["shards"][0]["address"], replica["port"])
    log("set-up (gateway, 1 node, Gemma replica): %.0f s" % (time.monotonic() - began))
    for _warm in range(5):
        ask(*leader)
        ask("127.0.0.1", port, key)
    direct, through = [], []
    for i in range(pairs):
        # Alternate which goes first, so that neither always follows the other.
        if i % 2:
            through.append(ask("127.0.0.1", port, key))
            direct.append(ask(*leader))
        else:
            direct.append(ask(*leader))
            through.append(ask("127.0.0.1", port, key))
    params = ("%d pairs, one client, /v1/completions %d tokens of %s Q4_K_M on 1 lab node (2 threads), "
              "gateway on 127.0.0.1, leader at %s:%d" % (pairs, TOKENS, MODEL, leader[0], leader[1]))
    spread = (percentile(direct, 0.99) - percentile(direct, 0.5)) * 1000
    for label, share in (("p50", 0.5), ("p99", 0.99)):
        ours, base = percentile(through, share), percentile(direct, share)
        report.add("gateway: %s latency through the gateway vs the leader directly" % label,
                   "%.1f ms" % (ours * 1000), "%.1f ms" % (base * 1000), ours / base, params,
                   "%+.1f ms per request for the key check, the body read and the extra hop; the direct requests "
                   "alone spread %.1f ms from p50 to p99, so a difference smaller than that is noise "
                   "(goal at p50: at most 1.1x)" % ((ours - base) * 1000, spread))


if __name__ == "__main__":
    sys.exit(main())
