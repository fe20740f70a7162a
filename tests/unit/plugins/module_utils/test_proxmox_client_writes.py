"""The client's writes under parallel load, with a fake API: a lock timeout is tried again with backoff (and only
a lock timeout), and at most ``write_concurrency`` writes run at once across processes."""

import multiprocessing
import os
import time

import pytest

from ansible_collections.llmgw.fleet.plugins.module_utils import proxmox_errors as errors
from ansible_collections.llmgw.fleet.plugins.module_utils.proxmox_client import (
    LOCK_RETRY_DELAYS,
    ProxmoxClient,
    WriteSlots,
    settings_from_params,
)

UPID = "UPID:pve:0001B2C3:0123ABCD:6650F00D:qmclone:9000:root@pam:"
LOCK_ERROR = "can't lock file '/var/lock/qemu-server/lock-9000.conf' - got timeout"


class FakeApi:
    """proxmoxer's shape: api(path).post(**params); every clone answers a UPID whose status comes from a script."""

    def __init__(self, exitstatuses):
        self.exitstatuses = list(exitstatuses)
        self.posts = []
        self.current = None

    def __call__(self, path):
        api = self

        class Resource:
            def post(self, **params):
                api.posts.append((path, params))
                api.current = api.exitstatuses.pop(0)
                return UPID

            def get(self, **params):
                if path.endswith("/status"):
                    return {"status": "stopped", "exitstatus": api.current}
                return [{"n": 1, "t": "creating a clone"}, {"n": 2, "t": "TASK ERROR: " + str(api.current)}]

        return Resource()


def client_for(api, slept):
    return ProxmoxClient(api, sleep=slept.append, clock=time.monotonic, jitter=lambda: 0.0)


def test_a_clone_refused_on_a_lock_is_tried_again_with_backoff_then_succeeds():
    api, slept = FakeApi([LOCK_ERROR, LOCK_ERROR, "OK"]), []
    assert client_for(api, slept).clone_vm("pve", 9000, 1101, "node01", timeout=10) == "OK"
    assert len(api.posts) == 3 and all(post[1]["newid"] == 1101 for post in api.posts)
    assert [s for s in slept if s >= 1] == list(LOCK_RETRY_DELAYS[:2])


def test_a_lock_that_stays_held_fails_after_the_bounded_tries_saying_so():
    api, slept = FakeApi([LOCK_ERROR] * (len(LOCK_RETRY_DELAYS) + 1)), []
    with pytest.raises(errors.TaskFailed) as caught:
        client_for(api, slept).clone_vm("pve", 9000, 1101, "node01", timeout=10)
    assert len(api.posts) == len(LOCK_RETRY_DELAYS) + 1
    assert "got timeout" in str(caught.value) and "tried %d times" % (len(LOCK_RETRY_DELAYS) + 1) in str(caught.value)


def test_any_other_task_error_is_never_tried_again():
    api, slept = FakeApi(["clone failed: out of space"]), []
    with pytest.raises(errors.TaskFailed) as caught:
        client_for(api, slept).clone_vm("pve", 9000, 1101, "node01", timeout=10)
    assert len(api.posts) == 1 and "out of space" in str(caught.value)
    assert "tried" not in str(caught.value)


def test_a_synchronous_lock_timeout_is_tried_again_too():
    calls = []

    class SyncLockApi:
        def __call__(self, path):
            class Resource:
                def post(self, **params):
                    calls.append(params)
                    if len(calls) == 1:
                        raise errors.Locked(LOCK_ERROR, status=500, reason=LOCK_ERROR)
                    return None  # done synchronously

            return Resource()

    slept = []
    client = ProxmoxClient(SyncLockApi(), sleep=slept.append, jitter=lambda: 0.0)
    assert client.update_config("pve", 1101, {"memory": 4096}, timeout=10) is None
    assert len(calls) == 2 and slept == [LOCK_RETRY_DELAYS[0]]


def test_write_concurrency_is_read_from_the_parameters_and_checked():
    base = {"api_host": "127.0.0.1", "api_token_id": "u@pve!t", "api_token_secret": "s"}
    assert settings_from_params(base).write_concurrency == 4
    assert settings_from_params(dict(base, write_concurrency=0)).write_concurrency == 0
    with pytest.raises(errors.ProxmoxError) as caught:
        settings_from_params(dict(base, write_concurrency=-2))
    assert "write_concurrency" in str(caught.value) and "-2" in str(caught.value)


def _hold_a_slot(directory, count, log, start):
    slots = WriteSlots(directory, count, sleep=lambda s: time.sleep(0.01))
    start.wait()
    with slots.hold("test write"):
        log.put(("in", time.monotonic()))
        time.sleep(0.3)
        log.put(("out", time.monotonic()))


def test_no_more_than_the_cap_of_writes_run_at_once_across_processes(tmp_path):
    log, start = multiprocessing.Queue(), multiprocessing.Event()
    procs = [multiprocessing.Process(target=_hold_a_slot, args=(str(tmp_path), 2, log, start)) for index in range(6)]
    for proc in procs:
        proc.start()
    start.set()
    for proc in procs:
        proc.join(30)
        assert proc.exitcode == 0
    events = sorted((log.get(timeout=5) for index in range(12)), key=lambda e: e[1])
    running = peak = 0
    for event in events:
        running += 1 if event[0] == "in" else -1
        peak = max(peak, running)
    assert peak == 2  # six writes, never more than two at once, and the cap was reached
    assert sorted(os.listdir(str(tmp_path))) == ["slot-0.lock", "slot-1.lock"]


def test_a_slot_that_never_comes_free_times_out_naming_the_cap(tmp_path):
    held = WriteSlots(str(tmp_path), 1)
    clock = iter(range(0, 10000, 100)).__next__
    waiting = WriteSlots(str(tmp_path), 1, sleep=lambda s: None, clock=clock, wait=300)
    with held.hold("first"), pytest.raises(errors.Timeout) as caught, waiting.hold("clone 9000 to 1101"):
        pass
    assert "clone 9000 to 1101" in str(caught.value) and "1 writes at once" in str(caught.value)
