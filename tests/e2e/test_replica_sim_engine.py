"""The simulated engine the replica role ships, run for real on loopback (no lab needed): the leader serves nothing
until every worker has joined, workers serve nothing at all, the leader dies when a worker goes quiet, and a worker
whose leader is gone waits to join again."""

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from helpers import free_ports

ENGINE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                      "roles", "replica", "files", "llmgw-sim-engine.py")


@pytest.fixture
def engine(tmp_path):
    procs = []
    port, rendezvous = free_ports(2)

    def start(rank, shards=3, replica="r1"):
        argv = [sys.executable, ENGINE, "--replica", replica, "--model", "sim-coder", "--rank", str(rank),
                "--shards", str(shards), "--leader", "127.0.0.1:%d" % rendezvous, "--bind", "127.0.0.1"]
        if rank == 0:
            argv += ["--host", "127.0.0.1", "--port", str(port)]
        log_path = str(tmp_path / ("rank%d-%d.log" % (rank, len(procs))))
        with open(log_path, "w") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        proc.log_path = log_path
        procs.append(proc)
        return proc

    start.port = port
    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def get(port, path):
    with urllib.request.urlopen("http://127.0.0.1:%d%s" % (port, path), timeout=5) as answer:
        return json.load(answer)


def wait_until(predicate, timeout=20):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def serves(port):
    try:
        get(port, "/health")
        return True
    except (urllib.error.URLError, OSError):
        return False


def test_the_leader_serves_only_once_every_worker_joined(engine):
    engine(0)
    engine(1)
    time.sleep(1.5)
    assert not serves(engine.port), "two of three shards must not serve"
    engine(2)
    wait_until(lambda: serves(engine.port))
    assert get(engine.port, "/health")["joined"] == [1, 2]
    request = urllib.request.Request("http://127.0.0.1:%d/v1/completions" % engine.port,
                                     data=json.dumps({"prompt": "hi", "max_tokens": 3}).encode())
    with urllib.request.urlopen(request, timeout=5) as answer:
        assert json.load(answer)["choices"][0]["text"] == "sim r1 rank0+2: tok tok tok"


def test_a_join_for_another_replica_or_shape_is_refused(engine):
    engine(0, shards=2)
    stranger = engine(1, shards=3)
    assert stranger.wait(timeout=20) == 1
    with open(stranger.log_path) as handle:
        assert "refused the join" in handle.read()
    assert not serves(engine.port)


def test_the_leader_dies_when_a_worker_goes_quiet_and_a_worker_outlives_its_leader(engine):
    leader = engine(0, shards=2)
    worker = engine(1, shards=2)
    wait_until(lambda: serves(engine.port))
    worker.send_signal(signal.SIGSTOP)
    assert leader.wait(timeout=30) == 1
    worker.send_signal(signal.SIGCONT)
    time.sleep(1)
    assert worker.poll() is None, "a worker waits for its leader to come back"
    engine(0, shards=2)
    wait_until(lambda: serves(engine.port))
