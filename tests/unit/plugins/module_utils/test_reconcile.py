import datetime

from ansible_collections.llmgw.fleet.plugins.module_utils import reconcile

NOW = datetime.datetime(2026, 12, 2, 12, 0, 0, tzinfo=datetime.timezone.utc)


def node(name, last_seen="2026-12-02T11:59:55Z", state="ready"):
    return {"name": name, "state": state, "last_seen": last_seen}


def replica(name, nodes, state="ready"):
    return {"name": name, "state": state, "shard_count": len(nodes),
            "shards": [{"rank": i, "node": n} for i, n in enumerate(nodes)]}


def units(name, ranks):
    return ["llmgw-shard-%s-%d.service" % (name, r) for r in ranks]


def test_a_node_unseen_longer_than_lost_after_is_lost_and_a_recent_one_is_not():
    nodes = [node("n1"), node("n2", "2026-12-02T11:59:00Z"), node("n3", None), node("n4", "2026-12-02T11:00:00Z")]
    probes = {"n1": {"reachable": False}, "n2": {"reachable": False, "error": "No route to host"},
              "n3": {"reachable": False}, "n4": {"reachable": True}}
    verdicts = reconcile.node_verdicts(nodes, probes, NOW, lost_after=10)
    assert verdicts["n1"] == {"verdict": "unseen", "unseen_for": 5.0}
    assert verdicts["n2"]["verdict"] == "lost" and "unseen for 60 s" in verdicts["n2"]["reason"]
    assert verdicts["n2"]["reason"].endswith("No route to host")
    assert verdicts["n3"]["verdict"] == "lost" and verdicts["n3"]["reason"] == "never seen"
    assert verdicts["n4"] == {"verdict": "seen"}
    assert reconcile.node_verdicts(nodes, probes, NOW)["n2"]["verdict"] == "unseen"  # default 60 s


def test_a_node_never_seen_gets_lost_after_from_its_registration():
    fresh = dict(node("new", None), registered_at="2026-12-02T11:59:58Z")
    old = dict(node("old", None), registered_at="2026-12-02T11:58:00Z")
    probes = {"new": {"reachable": False, "error": "timed out"}, "old": {"reachable": False}}
    verdicts = reconcile.node_verdicts([fresh, old], probes, NOW, lost_after=60)
    assert verdicts["new"] == {"verdict": "unseen", "unseen_for": 2.0}  # brand new and briefly unreachable: not lost
    assert verdicts["old"]["verdict"] == "lost"
    assert verdicts["old"]["reason"] == "unseen for 120 s (more than 60 s; never seen, registered 2026-12-02T11:58:00Z)"


def test_a_replica_on_a_lost_node_fails_whatever_its_state():
    found = reconcile.replica_verdicts([replica("a", ["n1", "n2"], state="starting")],
                                       {"n1": "ready", "n2": "lost"}, {})
    assert found == [{"name": "a", "kind": "lost", "reason": "lost node n2"}]


def test_adoption_a_ready_replica_running_fewer_shards_fails_naming_the_missing_ones():
    probes = {"n1": {"reachable": True, "active_units": []},
              "n2": {"reachable": True, "active_units": units("a", [1])}}
    (found,) = reconcile.replica_verdicts([replica("a", ["n1", "n2"])], {"n1": "ready", "n2": "ready"}, probes)
    assert found["kind"] == "short" and found["running"] == [1] and found["missing"] == [0]
    assert found["reason"] == "runs 1 of its 2 shards (rank 0 on n1 not running)"


def test_a_whole_replica_a_launching_one_and_one_on_an_unreached_node_are_left_alone():
    probes = {"n1": {"reachable": True, "active_units": units("a", [0]) + units("b", [0])},
              "n2": {"reachable": True, "active_units": units("a", [1])},
              "n3": {"reachable": False}}
    states = {"n1": "ready", "n2": "ready", "n3": "ready"}
    replicas = [replica("a", ["n1", "n2"]), replica("b", ["n1", "n3"]), replica("c", ["n2", "n1"], state="starting")]
    assert reconcile.replica_verdicts(replicas, states, probes) == []


def test_systemctl_list_units_output_is_parsed():
    text = ("llmgw-shard-a-0.service loaded active running llmgw a rank 0\n"
            "llmgw-shard-b-1.service loaded active running llmgw b rank 1\n\n")
    assert reconcile.parse_active_units(text) == ["llmgw-shard-a-0.service", "llmgw-shard-b-1.service"]


def lost(name, reasons):
    return dict(node(name, "2026-12-02T11:00:00Z", state="lost"), reasons=reasons)


def test_a_node_reconcile_lost_reached_again_has_recovered_and_an_unreached_one_stays_lost():
    nodes = [lost("n1", ["unseen for 61 s (more than 60 s; last seen ...)"]), lost("n2", ["never seen"]),
             lost("n3", ["unseen for 70 s"]), lost("n4", ["disk failed, replaced on Monday"])]
    probes = {"n1": {"reachable": True}, "n2": {"reachable": True}, "n3": {"reachable": False},
              "n4": {"reachable": True}}
    verdicts = reconcile.node_verdicts(nodes, probes, NOW, lost_after=10)
    assert verdicts["n1"] == verdicts["n2"] == {"verdict": "recovered"}
    assert verdicts["n3"] == {"verdict": "unseen", "unseen_for": 3600.0}
    assert verdicts["n4"] == {"verdict": "seen"}, "a node set lost by hand is not brought back by a probe"


def test_a_draining_node_that_is_lost_comes_back_draining():
    draining = node("n1", state="draining")
    reasons = reconcile.lost_reasons(draining, "unseen for 61 s")
    assert reasons == ["unseen for 61 s", reconcile.WAS_DRAINING]
    assert reconcile.state_after_recovery(dict(draining, state="lost", reasons=reasons)) == "draining"
    assert reconcile.state_after_recovery(lost("n2", reconcile.lost_reasons(node("n2"), "never seen"))) == "ready"


def test_a_node_in_maintenance_is_never_declared_lost_even_if_probed_and_unreached_for_long():
    nodes = [node("n1", "2026-12-01T00:00:00Z", state="maintenance"), node("n2", "2026-12-01T00:00:00Z")]
    probes = {"n1": {"reachable": False, "error": "timed out"}, "n2": {"reachable": False}}
    verdicts = reconcile.node_verdicts(nodes, probes, NOW, lost_after=10)
    assert "n1" not in verdicts and verdicts["n2"]["verdict"] == "lost"


def test_a_lost_node_whose_host_key_changed_stays_lost_and_says_so():
    error = "Host key verification failed."
    verdicts = reconcile.node_verdicts([lost("n1", ["unseen for 61 s"])], {"n1": {"reachable": False,
                                                                                  "error": error}}, NOW, 10)
    assert verdicts["n1"]["verdict"] == "unseen" and verdicts["n1"]["reason"] == reconcile.HOST_KEY_CHANGED


def test_stale_units_are_the_shard_units_no_recorded_shard_places_on_that_node():
    replicas = [replica("coder-a", ["n3", "n4"]), replica("broken", ["n2"], state="failed")]
    found = units("coder-a", [0, 1]) + units("broken", [0]) + ["llmgw-shard-old-1.service", "sshd.service",
                                                               "llmgw-shard-by-hand.service", "llmgw-shard-x-1.timer"]
    # n2 ran coder-a's rank 1 before coder-a moved to n3/n4; broken is failed but still placed on n2: kept;
    # units that only share the prefix (no rank, another type) are not this collection's
    expected = ["llmgw-shard-coder-a-0.service", "llmgw-shard-coder-a-1.service", "llmgw-shard-old-1.service"]
    assert reconcile.stale_units("n2", found, replicas) == expected
    assert reconcile.stale_units("n4", units("coder-a", [1]), replicas) == []
    assert reconcile.stale_units("n4", [], replicas) == []


def test_a_leader_failing_health_is_counted_run_by_run_and_relaunched_at_the_threshold():
    """A hung leader (unit active, port open, no /health answer): counted in its reasons, cleared by an answer,
    relaunched whole at unhealthy_after runs in a row."""
    hung = replica("a", ["n1", "n2"])
    first = reconcile.health_verdicts([hung], {"a": {"ok": False, "error": "timed out"}}, unhealthy_after=3)
    assert first == {"a": {"runs": 1, "relaunch": False, "reasons": [
        "leader failed /health in 1 reconcile run in a row (relaunched at 3): timed out"]}}
    hung["reasons"] = first["a"]["reasons"]
    assert reconcile.unhealthy_runs(hung) == 1
    second = reconcile.health_verdicts([hung], {"a": {"ok": False}}, unhealthy_after=3)["a"]
    assert second["runs"] == 2 and not second["relaunch"] and "2 reconcile runs in a row" in second["reasons"][0]
    hung["reasons"] = second["reasons"]
    third = reconcile.health_verdicts([hung], {"a": {"ok": False, "error": "timed out"}}, unhealthy_after=3)["a"]
    assert third["runs"] == 3 and third["relaunch"]
    hung["reasons"] = third["reasons"]
    probes = {"n1": {"reachable": True, "active_units": units("a", [0])},
              "n2": {"reachable": True, "active_units": units("a", [1])}}
    (found,) = reconcile.replica_verdicts([hung], {"n1": "ready", "n2": "ready"}, probes, unhealthy=["a"])
    assert found == {"name": "a", "kind": "unhealthy", "running": [0, 1], "missing": [],
                     "reason": "leader failed /health in 3 reconcile runs in a row (relaunched at 3): timed out"}


def test_the_count_keeps_the_replicas_other_reasons():
    serving = dict(replica("a", ["n1"]), reasons=["serving at http://10.77.0.11:8080/v1/completions"])
    failed = reconcile.health_verdicts([serving], {"a": {"ok": False, "error": "timed out"}})["a"]
    assert failed["reasons"] == ["leader failed /health in 1 reconcile run in a row (relaunched at 3): timed out",
                                 "serving at http://10.77.0.11:8080/v1/completions"]
    serving["reasons"] = failed["reasons"]
    assert reconcile.health_verdicts([serving], {"a": {"ok": True}})["a"]["reasons"] == [
        "serving at http://10.77.0.11:8080/v1/completions"]


def test_an_answer_clears_the_count_and_only_ready_replicas_asked_are_counted():
    counted = dict(replica("a", ["n1"]), reasons=[
        "leader failed /health in 2 reconcile runs in a row (relaunched at 3): timed out"])
    starting = replica("b", ["n1"], state="starting")
    healthy = replica("c", ["n1"])
    verdicts = reconcile.health_verdicts([counted, starting, healthy], {
        "a": {"ok": True}, "b": {"ok": False}, "c": {"ok": True}})
    assert verdicts == {"a": {"runs": 0, "reasons": [], "relaunch": False}}
    assert reconcile.unhealthy_runs(healthy) == 0
    assert reconcile.unhealthy_runs(dict(healthy, reasons=["something else"])) == 0


def test_a_replica_short_of_a_shard_is_short_not_unhealthy():
    probes = {"n1": {"reachable": True, "active_units": []},
              "n2": {"reachable": True, "active_units": units("a", [1])}}
    (found,) = reconcile.replica_verdicts([replica("a", ["n1", "n2"])], {"n1": "ready", "n2": "ready"}, probes,
                                          unhealthy=["a"])
    assert found["kind"] == "short"
