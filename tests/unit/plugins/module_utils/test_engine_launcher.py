import os

import pytest

from ansible_collections.llmgw.fleet.plugins.module_utils.engines import (
    ENGINES,
    UnknownEngineError,
    flag_check,
    get_engine,
    launcher,
)

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")


def help_of(name):
    with open(os.path.join(FIXTURES, "%s-b11434-help.txt" % name)) as handle:
        return handle.read()


def by_rank(engine, **overrides):
    return {r["rank"]: r for r in launcher.widest_commands(engine, **overrides)}


def test_llama_cpp_rank0_serves_with_rpc_to_every_other_rank():
    ranks = by_rank("llama.cpp")
    assert ranks[0]["binary"] == "llama-server" and ranks[0]["serves_api"]
    argv = ranks[0]["argv"]
    assert argv[argv.index("--rpc") + 1] == "10.77.0.102:50052,10.77.0.103:50052"
    for flag in ("--host", "--port", "--model", "--metrics", "--alias", "--ctx-size", "--parallel", "--threads",
                 "--n-gpu-layers"):
        assert flag in argv


def test_llama_cpp_workers_bind_their_fabric_address_only():
    ranks = by_rank("llama.cpp")
    for rank, address in ((1, "10.77.0.102"), (2, "10.77.0.103")):
        argv = ranks[rank]["argv"]
        assert ranks[rank]["binary"] == "ggml-rpc-server" and not ranks[rank]["serves_api"]
        assert argv[argv.index("--host") + 1] == address
        assert argv[argv.index("--port") + 1] == "50052"
        assert "0.0.0.0" not in argv


def test_a_single_node_llama_cpp_replica_has_no_rpc():
    ranks = launcher.commands("llama.cpp", {"model": "/m.gguf", "nodes": [{"name": "n1", "address": "10.0.0.1"}]})
    assert len(ranks) == 1 and "--rpc" not in ranks[0]["argv"]


def test_llama_cpp_bin_dir_prefixes_the_binaries():
    ranks = by_rank("llama.cpp", bin_dir="/opt/llmgw/engines/llama.cpp/current/")
    assert ranks[0]["argv"][0] == "/opt/llmgw/engines/llama.cpp/current/llama-server"
    assert ranks[1]["argv"][0] == "/opt/llmgw/engines/llama.cpp/current/ggml-rpc-server"


def test_vllm_ranks_share_the_layout_and_only_rank0_serves():
    ranks = by_rank("vllm")
    for rank, cmd in ranks.items():
        argv = cmd["argv"]
        assert argv[:3] == ["vllm", "serve", "/srv/models/model.gguf"]
        assert argv[argv.index("--nnodes") + 1] == "3"
        assert argv[argv.index("--node-rank") + 1] == str(rank)
        assert argv[argv.index("--master-addr") + 1] == "10.77.0.101"
        assert argv[argv.index("--tensor-parallel-size") + 1] == "8"
        assert argv[argv.index("--pipeline-parallel-size") + 1] == "3"
        assert ("--headless" in argv) == (rank != 0)


def test_sglang_ranks_point_at_rank0_and_use_the_canonical_tp_flag():
    ranks = by_rank("sglang")
    for rank, cmd in ranks.items():
        argv = cmd["argv"]
        assert argv[:3] == ["python3", "-m", "sglang.launch_server"]
        assert argv[argv.index("--dist-init-addr") + 1] == "10.77.0.101:25000"
        assert argv[argv.index("--node-rank") + 1] == str(rank)
        assert argv[argv.index("--tp-size") + 1] == "24"
        assert "--tp" not in argv


@pytest.mark.parametrize("engine", sorted(launcher.BUILDERS))
def test_every_flag_the_launcher_passes_is_in_that_engines_table(engine):
    table = get_engine(engine)
    for binary, flags in launcher.flags_by_binary(engine).items():
        assert set(flags) <= set(table.FLAGS[binary]), (binary, set(flags) - set(table.FLAGS[binary]))


def test_the_widest_llama_cpp_command_carries_a_nodes_engine_args():
    server = launcher.widest_commands("llama.cpp")[0]
    assert server["binary"] == "llama-server" and "--no-repack" in server["argv"]


def test_the_widest_llama_cpp_commands_pass_the_real_b11434_help():
    for binary, flags in launcher.flags_by_binary("llama.cpp").items():
        results = flag_check.check_flags(flags, help_of(binary))
        assert [r for r in results if r["status"] != "offered"] == [], binary


def test_every_table_names_its_version_and_source():
    for name, table in ENGINES.items():
        assert name == table.ENGINE and table.VERSION and table.SOURCE


def test_bad_specs_are_refused():
    with pytest.raises(launcher.LaunchSpecError):
        launcher.commands("llama.cpp", {"model": "/m", "nodes": []})
    with pytest.raises(launcher.LaunchSpecError):
        launcher.commands("llama.cpp", {"model": "/m", "nodes": [{"name": "n1"}]})
    with pytest.raises(launcher.LaunchSpecError):
        launcher.commands("tgi", {"model": "/m", "nodes": [{"name": "n1", "address": "a"}]})
    with pytest.raises(UnknownEngineError):
        get_engine("tgi")
