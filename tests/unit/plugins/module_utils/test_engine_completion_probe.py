"""The verdict of the completion probe: which arguments a node's llama-server needs, or why it cannot serve."""

import pytest

from ansible_collections.llmgw.fleet.plugins.module_utils.engines import completion_probe

SIGILL = -4


def attempt(args=(), answered=False, rc=None, variant="sapphirerapids", error="", log_tail=""):
    return {"args": list(args), "answered": answered, "rc": rc, "variant": variant, "error": error,
            "log_tail": log_tail}


def test_a_plain_answer_needs_no_arguments_and_warns_of_nothing():
    found = completion_probe.verdict("node01", "probe.gguf", [attempt(answered=True)])
    assert found == {"engine_args": [], "warnings": [], "problem": None}


def test_sigill_in_the_amx_variant_then_an_answer_with_no_repack_records_it_and_says_why():
    found = completion_probe.verdict("node01", "probe.gguf", [
        attempt(rc=SIGILL), attempt(args=["--no-repack"], answered=True)])
    assert found["engine_args"] == ["--no-repack"] and found["problem"] is None
    (warning,) = found["warnings"]
    assert warning.startswith("node01: ")
    assert "(sapphirerapids CPU backend, no extra arguments) crashed with SIGILL" in warning
    assert "AMX tile instructions" in warning and "engine_args ['--no-repack'], which every llama-server" in warning
    assert "without repacking" in warning


def test_every_failure_is_named_when_nothing_answers_with_the_last_log_lines():
    found = completion_probe.verdict("node02", "probe.gguf", [
        attempt(rc=SIGILL, variant="haswell"),
        attempt(args=["--no-repack"], rc=1, variant="haswell", log_tail="error: unknown argument: --no-repack")])
    assert found["engine_args"] is None and found["warnings"] == []
    problem = found["problem"]
    assert problem.startswith("node02: llama-server did not answer a completion on the quantized probe probe.gguf")
    # haswell is not an AMX variant: the generic SIGILL meaning (a CPU type that hides features) is given
    assert "(haswell CPU backend, no extra arguments) crashed with SIGILL: an illegal instruction" in problem
    assert "(haswell CPU backend, --no-repack) exited with status 1" in problem
    assert problem.endswith("Last log lines: error: unknown argument: --no-repack")


def test_an_http_side_failure_is_said_as_seen():
    found = completion_probe.verdict("node03", "probe.gguf", [
        attempt(variant=None, error="completion: HTTP Error 400: Bad Request")])
    assert "llama-server (CPU backend unknown, no extra arguments): completion: HTTP Error 400" in found["problem"]


def test_only_a_crash_is_worth_a_fallback():
    assert completion_probe.crashed(attempt(rc=SIGILL))
    assert completion_probe.crashed(attempt(rc=132))  # a shell's 128 + 4
    assert not completion_probe.crashed(attempt(rc=1))
    assert not completion_probe.crashed(attempt(error="no answer within 120 s"))
    assert not completion_probe.crashed(attempt(answered=True))


def test_a_verdict_needs_the_plain_attempt():
    with pytest.raises(ValueError):
        completion_probe.verdict("node01", "probe.gguf", [])
