"""The speed probe's pure parts: its model file, the llama-bench command and output, and the verdict's words."""

import hashlib

import pytest

from ansible_collections.llmgw.fleet.plugins.module_utils.engines import speed, speed_model

BENCH_JSON = """[
  {"build_commit": "x", "n_prompt": 128, "n_gen": 0, "n_threads": 2, "avg_ts": 2968.2, "stddev_ts": 12.0},
  {"build_commit": "x", "n_prompt": 0, "n_gen": 32, "n_threads": 2, "avg_ts": 1874.4, "stddev_ts": 3.0}
]"""


def test_the_probe_model_is_the_file_its_digest_names_and_gguf_reads_it_as_a_q4_0_llama(tmp_path):
    gguf = pytest.importorskip("gguf")
    path = str(tmp_path / "speed.gguf")
    assert speed_model.write(path) is True
    with open(path, "rb") as handle:
        data = handle.read()
    assert hashlib.sha256(data).hexdigest() == speed_model.SHA256
    assert 3_000_000 < len(data) < 6_000_000  # a few MB, like the issue asks
    assert speed_model.write(path) is False and speed_model.is_current(path)

    reader = gguf.GGUFReader(path)
    assert str(bytes(reader.fields["general.architecture"].parts[-1]), "utf-8") == "llama"
    by_name = {t.name: t for t in reader.tensors}
    assert len(by_name) == 3 + 9 * speed_model.N_LAYER
    assert by_name["blk.0.ffn_up.weight"].tensor_type == gguf.GGMLQuantizationType.Q4_0
    assert list(by_name["blk.0.ffn_up.weight"].shape) == [speed_model.N_EMBD, speed_model.N_FF]
    assert by_name["output_norm.weight"].tensor_type == gguf.GGMLQuantizationType.F32

    with open(path, "r+b") as handle:
        handle.seek(len(data) - 1)
        handle.write(b"\x01")
    assert not speed_model.is_current(path) and speed_model.write(path) is True


def test_the_bench_command_carries_the_nodes_threads_and_no_repack():
    argv = speed.bench_argv("/e/llama-bench", "/m.gguf", 4, ["--no-repack"])
    assert argv[:9] == ["/e/llama-bench", "-m", "/m.gguf", "-p", "128", "-n", "32", "-t", "4"]
    assert argv[-2:] == ["--repack", "0"] and "-o" in argv and "json" in argv
    assert "--repack" not in speed.bench_argv("/e/llama-bench", "/m.gguf", 4, [])
    assert speed.threads_in(["--no-repack", "-t", "3"]) == 3
    assert speed.threads_in(["--threads=1"]) == 1
    assert speed.threads_in(["--no-repack"]) is None


def test_bench_output_is_read_and_a_partial_one_refused():
    assert speed.parse_bench("load_backend: ...\n" + BENCH_JSON) == {"pp": 2968.2, "tg": 1874.4}
    with pytest.raises(ValueError, match="not a prompt and a generation test"):
        speed.parse_bench(BENCH_JSON.split("},", maxsplit=1)[0] + "}]")


def measured(variant="zen4", pp=2968.0, base_pp=327.0, threads=2, vcpus=2):
    return speed.measurement(variant, threads, vcpus, {"pp": pp, "tg": 1874.0}, {"pp": base_pp, "tg": 349.0})


def test_a_fast_node_passes_with_its_ratios():
    speed_now = measured()
    assert (speed_now["pp_ratio"], speed_now["tg_ratio"]) == (9.08, 5.37)
    assert speed.verdict("node01", speed_now) == []


def test_a_backend_barely_faster_than_its_baseline_is_named_with_numbers_causes_and_fix():
    (reason,) = speed.verdict("node01", measured(pp=400.0, base_pp=327.0))
    assert reason.startswith("node01 runs prompts slowly: its CPU backend zen4 is only 1.2x its own scalar baseline")
    assert "400 vs 327 tokens/s of prompt processing" in reason and "2 threads on 2 vCPUs" in reason
    assert "set cpu: host" in reason and "allow_slow_node=true" in reason


def test_the_scalar_baseline_itself_is_said_plainly():
    (reason,) = speed.verdict("node09", measured(variant="x64", pp=327.0, base_pp=327.0))
    assert "its CPU backend x64 is the scalar baseline itself" in reason


def test_an_engine_held_to_fewer_threads_than_vcpus_is_named_with_both_counts():
    (reason,) = speed.verdict("node03", measured(threads=1, vcpus=8))
    assert "the engine runs 1 thread where the node has 8 vCPUs" in reason and "--threads 8" in reason
    assert "12%" in reason


def test_a_node_far_below_the_fleets_median_per_thread_for_its_variant_is_named_with_the_median():
    peers = [measured(pp=2968.0), measured(pp=3200.0, threads=4, vcpus=4), measured(pp=2000.0),
             measured(variant="haswell", pp=100.0), {}]
    # zen4 per thread: 1484, 800, 1000 -> median 1000; haswell and the unmeasured node do not count.
    (reason,) = speed.fleet_verdict("node07", measured(pp=800.0), peers)
    assert reason.startswith("node07 runs prompts at 400.0 tokens/s per thread, 40% of the median 1000.0 of the "
                             "fleet's 3 ready zen4 nodes")
    assert "dedicated cores" in reason and "allow_slow_node=true" in reason
    assert speed.fleet_verdict("node07", measured(pp=1000.0), peers) == []  # 500 per thread: half, passes
    assert speed.fleet_verdict("node07", measured(pp=999.0), peers) != []


def test_the_fleet_comparison_needs_enough_peers_of_the_same_variant():
    lone = [measured(pp=3000.0), measured(variant="haswell", pp=3000.0)]
    assert speed.fleet_verdict("node07", measured(pp=100.0), lone) == []
    assert speed.fleet_verdict("node07", measured(pp=100.0), lone, min_peers=1) != []
