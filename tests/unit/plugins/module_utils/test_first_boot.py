import pytest

from ansible_collections.llmgw.fleet.plugins.module_utils import first_boot


@pytest.mark.parametrize("stderr,state", [
    ("ssh: connect to host 10.77.0.105 port 22: No route to host", first_boot.NO_ROUTE),
    ("ssh: connect to host 10.77.0.105 port 22: Connection refused", first_boot.REFUSED),
    ("ssh: connect to host 10.77.0.105 port 22: Connection timed out", first_boot.TIMED_OUT),
    ("debian@10.77.0.105: Permission denied (publickey).", first_boot.AUTH_FAILED),
    ("kex_exchange_identification: read: Connection reset by peer", first_boot.RESET),
    ("something new", first_boot.UNKNOWN),
])
def test_ssh_failures(stderr, state):
    assert first_boot.classify(255, "", stderr) == state


@pytest.mark.parametrize("stdout,state", [
    ("status: done\n", first_boot.READY),
    ("status: running\n", first_boot.CLOUD_INIT_RUNNING),
    ("status: not run\n", first_boot.CLOUD_INIT_RUNNING),
    ("status: error\n", first_boot.CLOUD_INIT_ERROR),
])
def test_cloud_init_status(stdout, state):
    assert first_boot.classify(0, stdout, "") == state


def test_timeline_keeps_distinct_states_in_order():
    timeline = first_boot.Timeline()
    timeline.record(0.0, first_boot.REFUSED)
    timeline.record(1.0, first_boot.REFUSED)
    timeline.record(2.5, first_boot.CLOUD_INIT_RUNNING)
    timeline.record(4.0, first_boot.RESET, "kex_exchange_identification")
    assert [e["state"] for e in timeline.events] == [first_boot.REFUSED, first_boot.CLOUD_INIT_RUNNING,
                                                     first_boot.RESET]
    assert timeline.last["after_s"] == 4.0


@pytest.mark.parametrize("stderr", [
    "@@@@@@@@\n@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @\n...\nHost key verification failed.",
    "No ED25519 host key is known for node05 and you have requested strict checking.\nHost key verification failed.",
])
def test_a_key_other_than_the_pinned_one_is_key_changed(stderr):
    assert first_boot.classify(255, "", stderr) == first_boot.KEY_CHANGED


@pytest.mark.parametrize("exitcode, stdout, state", [
    (0, "status: done\n", first_boot.AGENT_READY),
    (0, "status: running\n", first_boot.AGENT_CLOUD_INIT_RUNNING),
    (1, "status: error\n", first_boot.CLOUD_INIT_ERROR),
    (255, "", first_boot.UNKNOWN),
    (127, "", first_boot.UNKNOWN),
])
def test_cloud_init_status_through_the_agent(exitcode, stdout, state):
    assert first_boot.classify_agent_status(exitcode, stdout) == state


def test_timeout_message_names_the_node_the_wait_and_the_last_state():
    timeline = first_boot.Timeline()
    assert "nothing tried" in first_boot.timeout_message("node05", "10.77.0.105", 5, timeline.last)
    timeline.record(1.0, first_boot.AUTH_FAILED, "debian@10.77.0.105: Permission denied (publickey).")
    message = first_boot.timeout_message("node05", "10.77.0.105", 5, timeline.last)
    assert message.startswith("node05 (10.77.0.105) was not ready after 5 s; last seen: " + first_boot.AUTH_FAILED)
    assert message.endswith("(debian@10.77.0.105: Permission denied (publickey).)")


def test_the_timeline_keeps_all_of_an_attempt_nothing_recognises():
    assert first_boot.detail(first_boot.UNKNOWN, 255, "", "") == "exit 255; stdout: (none); stderr: (none)"
    assert first_boot.detail(first_boot.UNKNOWN, 1, "\n", "sudo: no tty\n") == (
        "exit 1; stdout: (none); stderr: sudo: no tty")
    assert first_boot.detail(first_boot.REFUSED, 255, "", "Connection refused") == "Connection refused"
    assert first_boot.detail(first_boot.READY, 0, "status: done\n", "") == "status: done\n"
