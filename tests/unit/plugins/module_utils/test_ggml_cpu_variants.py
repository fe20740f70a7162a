import pytest

from ansible_collections.llmgw.fleet.plugins.module_utils import ggml_cpu_variants as gcv


def flags(text):
    return text.split()


# /proc/cpuinfo flags of guests of QEMU's CPU models as Proxmox VE names them (QEMU target/i386/cpu.c feature
# sets; the x86-64-vN levels follow the psABI micro-architecture levels).
KVM64 = flags("fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse sse2 "
              "syscall nx lm rep_good nopl cpuid pni cx16 x2apic hypervisor lahf_lm")
X86_64_V2 = KVM64 + flags("ssse3 sse4_1 sse4_2 popcnt")
X86_64_V2_AES = X86_64_V2 + ["aes"]
X86_64_V3 = X86_64_V2_AES + flags("avx avx2 bmi1 bmi2 f16c fma movbe xsave abm")
X86_64_V4 = X86_64_V3 + flags("avx512f avx512bw avx512cd avx512dq avx512vl")
# This lab host (Intel Sapphire Rapids class, under KVM), from its /proc/cpuinfo.
HOST = X86_64_V4 + flags("avx_vnni avx512_bf16 avx512vbmi avx512_vbmi2 avx512_vnni avx512_fp16 amx_bf16 amx_tile "
                         "amx_int8 avx512ifma sha_ni")
ZEN3 = X86_64_V3 + flags("sse4a sha_ni vaes vpclmulqdq")


@pytest.mark.parametrize("flags, expected", [
    (KVM64, "x64"),
    (X86_64_V2, "sse42"),
    (X86_64_V2_AES, "sse42"),
    (X86_64_V3, "haswell"),
    (X86_64_V4, "skylakex"),
    (HOST, "sapphirerapids"),
    (ZEN3, "haswell"),
])
def test_predict_the_variant_llama_cpp_loads(flags, expected):
    assert gcv.predict(flags)["variant"] == expected


def test_every_proxmox_model_in_the_table_predicts_its_variant():
    flags = {"kvm64": KVM64, "kvm32": KVM64, "qemu64": KVM64, "qemu32": KVM64, "x86-64-v2": X86_64_V2,
             "x86-64-v2-AES": X86_64_V2_AES, "x86-64-v3": X86_64_V3, "x86-64-v4": X86_64_V4}
    for model, variant in gcv.PVE_CPU_MODEL_VARIANT.items():
        assert gcv.predict(flags[model])["variant"] == variant, model


def test_scores_are_the_bits_of_cpu_feats_cpp():
    # 1 + FMA(1) + F16C(2) + SSE42(4) + BMI2(8) + AVX(16) + AVX2(32)
    assert gcv.score("haswell", HOST) == 64
    # haswell + AVX512(128) + VBMI(256) + BF16(512) + VNNI(1024) + AMX_INT8(2048)
    assert gcv.score("sapphirerapids", HOST) == 4032
    assert gcv.score("alderlake", HOST) == 128
    assert gcv.score("x64", KVM64) == 1
    assert gcv.score("sse42", KVM64) == 0


def test_a_missing_feature_scores_zero_even_when_the_rest_is_there():
    no_bmi2 = [f for f in HOST if f != "bmi2"]
    assert gcv.score("haswell", no_bmi2) == 0
    assert gcv.predict(no_bmi2)["variant"] == "piledriver"


def test_the_better_variants_name_what_this_cpu_lacks():
    better = {b["variant"]: b["missing"] for b in gcv.predict(KVM64)["better"]}
    assert better["sse42"] == ["sse4_2"]
    assert better["haswell"] == ["avx", "avx2", "bmi2", "f16c", "fma", "sse4_2"]
    assert "x64" not in better


def test_prediction_is_limited_to_the_variants_an_engine_ships():
    shipped = ["x64", "sse42", "haswell"]
    assert gcv.predict(HOST, shipped)["variant"] == "haswell"
    assert gcv.predict(KVM64, shipped)["variant"] == "x64"
    assert gcv.predict(HOST, ["sse42"])["variant"] == "sse42"
    assert gcv.predict(KVM64, ["haswell"])["variant"] is None


def test_unknown_variant_names_are_refused():
    with pytest.raises(gcv.UnknownVariantError):
        gcv.required_flags("pentium")
    with pytest.raises(gcv.UnknownVariantError):
        gcv.predict(HOST, ["x64", "pentium"])


def test_cpuinfo_text_and_plain_lists_parse_to_the_same_flags():
    text = "processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: fpu sse4_2 avx\nbugs\t\t: spectre_v1\n"
    assert gcv.parse_cpuinfo_flags(text) == frozenset({"fpu", "sse4_2", "avx"})
    assert gcv.parse_cpuinfo_flags("fpu sse4_2 avx") == frozenset({"fpu", "sse4_2", "avx"})
    assert gcv.parse_cpuinfo_flags("Flags: a b\n") == frozenset({"a", "b"})


def test_the_load_backend_line_names_the_variant():
    out = ("load_backend: loaded RPC backend from /opt/e/libggml-rpc.so\n"
           "load_backend: loaded CPU backend from /opt/e/libggml-cpu-sapphirerapids.so\n")
    assert gcv.loaded_variant(out) == ("sapphirerapids", "/opt/e/libggml-cpu-sapphirerapids.so")
    assert gcv.loaded_variant("nothing here") == (None, None)
    assert gcv.variant_of_file("libggml-cpu-x64.so") == "x64"
    assert gcv.variant_of_file("libggml-rpc.so") is None


def test_a_kvm64_node_is_refused_naming_the_cpu_type_the_missing_flags_and_the_fix():
    out = "load_backend: loaded CPU backend from /opt/e/libggml-cpu-x64.so\n"
    verdict = gcv.assess(KVM64, engine_output=out, vm_cpu="kvm64", node="node05")
    assert verdict["refused"] and verdict["loaded"] == "x64" and verdict["agree"] is True
    for part in ("node05", "kvm64", "sse4_2", "avx2", "fma", "cpu: host", "x64"):
        assert part in verdict["message"]


def test_x64_is_refused_even_with_a_floor_set_to_x64():
    assert gcv.assess(KVM64, floor="x64")["refused"]


def test_a_floor_above_the_loaded_variant_refuses():
    verdict = gcv.assess(X86_64_V2_AES, floor="haswell", vm_cpu="x86-64-v2-AES")
    assert verdict["refused"]
    assert verdict["missing"] == {"haswell": ["avx", "avx2", "bmi2", "f16c", "fma"]}
    assert "x86-64-v2-AES" in verdict["message"]
    assert not gcv.assess(X86_64_V2_AES)["refused"]


def test_an_unknown_cpu_type_is_said_to_be_unknown():
    assert "not known" in gcv.assess(KVM64)["message"]


def test_a_disagreement_between_prediction_and_engine_is_reported_not_refused():
    out = "load_backend: loaded CPU backend from /e/libggml-cpu-zen4.so"
    verdict = gcv.assess(HOST, engine_output=out)
    assert verdict["agree"] is False and not verdict["refused"]
    assert "zen4" in verdict["message"] and "sapphirerapids" in verdict["message"]


def test_an_engine_that_loads_x64_on_a_good_cpu_is_refused_by_what_it_loaded():
    out = "load_backend: loaded CPU backend from /e/libggml-cpu-x64.so"
    assert gcv.assess(HOST, engine_output=out)["refused"]


def test_unknown_floor_is_refused():
    with pytest.raises(gcv.UnknownVariantError):
        gcv.assess(HOST, floor="nehalem")


def test_an_engine_shipping_only_x64_on_a_capable_cpu_is_refused_for_what_it_ships():
    out = "load_backend: loaded CPU backend from /e/libggml-cpu-x64.so"
    verdict = gcv.assess(HOST, shipped=["x64"], engine_output=out, vm_cpu="host")
    assert verdict["refused"] and verdict["missing"] == {}
    assert "ships only x64" in verdict["message"] and "sapphirerapids" in verdict["message"]
    assert "GGML_CPU_ALL_VARIANTS" in verdict["message"]


def test_vm_plan_refuses_the_models_this_table_calls_slow():
    """One table of Proxmox CPU models: vm_plan's slow models are the ones whose variant lacks AVX2 and FMA."""
    from ansible_collections.llmgw.fleet.plugins.module_utils import vm_plan

    assert vm_plan.SLOW_CPU_VARIANTS == {"kvm64": "x64", "kvm32": "x64", "qemu64": "x64", "qemu32": "x64",
                                         "x86-64-v2": "sse42", "x86-64-v2-AES": "sse42"}
    for variant in gcv.SLOW_VARIANTS:
        assert not {"AVX2", "FMA"} <= set(gcv.VARIANTS[variant])
