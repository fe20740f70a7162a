import pytest

from ansible_collections.llmgw.fleet.plugins.module_utils import replica_plan
from ansible_collections.llmgw.fleet.plugins.module_utils.engines import launcher


def replica(name="coder-a", engine="sim", shards=2, gpus=4, port=None, nodes=("node01", "node02"), **extra):
    record = {"name": name, "engine": engine, "model": "sim-coder", "shard_count": shards, "gpus_per_shard": gpus,
              "port": port, "options": {}, "state": "placing",
              "shards": [{"rank": i, "node": n, "address": "10.77.0.%d" % (131 + i), "gpus": list(range(gpus)),
                          "fabric": "ib-a"} for i, n in enumerate(nodes)]}
    record.update(extra)
    return record


def test_sim_units_carry_port_leader_and_shard_count_and_start_workers_first():
    plan = replica_plan.plan_units(replica(nodes=("node01", "node02", "node03"), shards=3))
    assert plan["start_order"] == [1, 2, 0]
    assert [u["unit"] for u in plan["units"]] == ["llmgw-shard-coder-a-%d.service" % r for r in range(3)]
    for unit in plan["units"]:
        env = unit["environment"]
        assert (env["LLMGW_PORT"], env["LLMGW_SHARDS"], env["LLMGW_LEADER_ADDRESS"]) == ("8080", "3", "10.77.0.131")
        assert env["LLMGW_RANK"] == str(unit["rank"]) and env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
        assert "--leader 10.77.0.131:8081" in unit["command"]
        assert "Environment=LLMGW_SHARDS=3" in unit["unit_text"]
    leader, worker = plan["units"][0], plan["units"][1]
    assert leader["serves_api"] and leader["listens"] == [8080] and "--port 8080" in leader["command"]
    assert not worker["serves_api"] and worker["listens"] == [] and "--port" not in worker["argv"]
    assert plan["leader"]["health_url"] == "http://10.77.0.131:8080/health"


def test_llama_cpp_rank0_gets_the_model_and_rpc_to_the_workers_on_the_next_port():
    plan = replica_plan.plan_units(replica(engine="llama_cpp", gpus=0, port=8082), model_path="/m/tiny.gguf",
                                   engine_dir="/opt/e")
    leader, worker = plan["units"]
    assert leader["argv"][0] == "/opt/e/llama-server" and "--rpc 10.77.0.132:8083" in leader["command"]
    assert "--n-gpu-layers 99" in leader["command"]
    assert worker["argv"][:5] == ["/opt/e/ggml-rpc-server", "--host", "10.77.0.132", "--port", "8083"]
    assert [u["needs_model"] for u in plan["units"]] == [True, False]
    assert "CUDA_VISIBLE_DEVICES" not in leader["environment"]


def test_the_leaders_node_engine_args_reach_llama_server_only():
    record = replica(engine="llama_cpp", gpus=0)
    record["shards"][0]["engine_args"] = ["--no-repack"]
    record["shards"][1]["engine_args"] = ["--no-repack"]
    leader, worker = replica_plan.plan_units(record, model_path="/m/tiny.gguf")["units"]
    assert leader["argv"][-1] == "--no-repack" and "--no-repack" in leader["exec_start"]
    assert "--no-repack" not in worker["argv"]  # ggml-rpc-server has no such flag
    single = replica(engine="llama_cpp", gpus=0, shards=1, nodes=("node03",))
    assert "--no-repack" not in replica_plan.plan_units(single, model_path="/m/tiny.gguf")["units"][0]["argv"]


def test_vllm_and_sglang_load_the_model_on_every_rank():
    for engine in ("vllm", "sglang"):
        plan = replica_plan.plan_units(replica(engine=engine), model_path="/m/model")
        assert [u["needs_model"] for u in plan["units"]] == [True, True]
        assert [u["serves_api"] for u in plan["units"]] == [True, False]


def test_a_replica_short_of_shards_or_badly_named_is_refused():
    short = replica()
    short["shards"] = short["shards"][:1]
    with pytest.raises(replica_plan.ReplicaPlanError, match="holds 1 of its 2 shards"):
        replica_plan.plan_units(short)
    with pytest.raises(replica_plan.ReplicaPlanError, match="lower case"):
        replica_plan.plan_units(replica(name="Coder_A"))
    with pytest.raises(replica_plan.ReplicaPlanError, match="unknown engine"):
        replica_plan.plan_units(replica(engine="tgi"))


def test_a_port_held_on_a_shared_node_moves_to_the_next_free_pair():
    mine = replica(port=8080, nodes=("node03", "node04"))
    other = replica(name="coder-b", port=8080, nodes=("node03", "node04"))
    elsewhere = replica(name="coder-c", port=8082, nodes=("node01", "node02"))
    assert replica_plan.choose_port(mine, [other, elsewhere]) == 8082
    assert replica_plan.choose_port(mine, [elsewhere]) == 8080
    assert replica_plan.choose_port(replica(port=None), []) == 8080


def test_systemd_quoting_escapes_specifiers_and_spaces():
    assert replica_plan.systemd_quote("plain") == "plain"
    assert replica_plan.systemd_quote("50%") == "50%%"
    assert replica_plan.systemd_quote('a "b" $c') == '"a \\"b\\" $$c"'
    assert replica_plan.systemd_quote("a\nb\tc") == '"a\\x0ab\\x09c"'


def test_a_value_with_a_line_break_cannot_add_a_directive_to_the_unit():
    injected = "m\n[Service]\nExecStartPre=/bin/rm -rf /\nUser=root"
    plan = replica_plan.plan_units(replica(model=injected, nodes=("node01",), shards=1))
    text = plan["units"][0]["unit_text"]
    directives = [line.split("=", 1)[0] for line in text.splitlines() if "=" in line and not line.startswith(" ")]
    assert "ExecStartPre" not in directives and directives.count("ExecStart") == 1
    assert [line for line in text.splitlines() if line.startswith("[")] == ["[Unit]", "[Service]", "[Install]"]
    assert "\\x0a[Service]\\x0aExecStartPre=/bin/rm -rf /\\x0aUser=root" in text


def test_the_launcher_knows_the_simulated_engine_without_a_flag_table():
    ranks = launcher.commands("sim", {"model": "m", "port": 9000, "rendezvous_port": 9001,
                                      "nodes": [{"name": "a", "address": "10.0.0.1"},
                                                {"name": "b", "address": "10.0.0.2"}]})
    assert [r["serves_api"] for r in ranks] == [True, False]
    assert "sim" not in launcher.BUILDERS and launcher.canonical_engine("llama_cpp") == "llama.cpp"
