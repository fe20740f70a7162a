from ansible_collections.llmgw.fleet.plugins.module_utils.engines import runtime

LDD_MISSING_GOMP = """\
\tlinux-vdso.so.1 (0x00007ffd3b5f2000)
\tlibggml-base.so.0 => /opt/llmgw/engines/llama.cpp/b11434/libggml-base.so.0 (0x00007f0b3c000000)
\tlibgomp.so.1 => not found
\tlibstdc++.so.6 => /lib/x86_64-linux-gnu/libstdc++.so.6 (0x00007f0b3bc00000)
\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f0b3ba1f000)
"""
LOADER_ERROR = ("/opt/llmgw/engines/llama.cpp/b11434/llama-server: error while loading shared libraries: "
                "libgomp.so.1: cannot open shared object file: No such file or directory\n")


def test_ldd_not_found_lines_are_named_once():
    assert runtime.missing_libraries(LDD_MISSING_GOMP + LDD_MISSING_GOMP) == ["libgomp.so.1"]
    assert runtime.missing_libraries("\tlibc.so.6 => /lib/libc.so.6 (0x1)\n") == []


def test_a_missing_library_is_named_with_its_debian_package():
    problems = runtime.merge_missing(runtime.start_problems("llama-server", 127, LOADER_ERROR,
                                                            {"libggml-cpu-haswell.so": LDD_MISSING_GOMP}))
    assert len(problems) == 1
    assert problems[0]["library"] == "libgomp.so.1" and problems[0]["package"] == "libgomp1"
    assert "apt-get install libgomp1" in problems[0]["message"]


def test_the_loader_error_alone_is_enough_to_name_the_library():
    problems = runtime.start_problems("llama-server", 127, LOADER_ERROR)
    assert [p["package"] for p in problems] == ["libgomp1"]


def test_an_unknown_library_points_at_apt_file():
    problems = runtime.start_problems("x", 0, "", {"x": "\tlibfoo.so.9 => not found\n"})
    assert problems[0]["package"] is None and "apt-file search libfoo.so.9" in problems[0]["message"]


def test_sigill_is_named_with_what_it_means():
    for code in (-4, 132):
        problems = runtime.start_problems("llama-server", code, "")
        assert problems[0]["kind"] == "crash" and problems[0]["signal"] == "SIGILL"
        assert "CPU type" in problems[0]["message"]


def test_a_plain_failure_reports_its_status_and_last_lines():
    problems = runtime.start_problems("llama-server", 1, "a\nb\nerror: invalid argument: --bogus\n")
    assert problems[0]["kind"] == "exit" and "--bogus" in problems[0]["message"]


def test_a_clean_start_has_no_problems():
    assert runtime.start_problems("llama-server", 0, "version: 11434\n", {"llama-server": "\tlibc.so.6 => /x\n"}) == []


def test_signal_names():
    assert runtime.signal_name(-11) == "SIGSEGV"
    assert runtime.signal_name(0) is None
    assert runtime.signal_name(1) is None
    assert runtime.signal_name(None) is None


def test_one_missing_library_needed_by_many_files_is_reported_once_naming_them_all():
    reports = {"/e/libggml-cpu-x64.so": LDD_MISSING_GOMP, "/e/libggml-cpu-haswell.so": LDD_MISSING_GOMP}
    problems = runtime.start_problems("/e/llama-server", 127, LOADER_ERROR, reports)
    problems += runtime.start_problems("/e/ggml-rpc-server", 127, LOADER_ERROR, reports)
    merged = runtime.merge_missing(problems)
    assert len(merged) == 1
    assert merged[0]["files"] == ["libggml-cpu-haswell.so", "libggml-cpu-x64.so", "llama-server",
                                  "ggml-rpc-server"]
    assert merged[0]["message"].startswith("libgomp.so.1 is not installed (needed by libggml-cpu-haswell.so")
    assert merged[0]["message"].endswith("(apt-get install libgomp1)")


def test_run_binary_runs_in_root_without_stdin_and_says_why_it_could_not(tmp_path):
    """The one subprocess helper of the engine modules: cwd / (llama.cpp also loads backends from the current
    directory), no stdin, a missing binary or a timeout as an error rather than an exception."""
    script = tmp_path / "engine"
    script.write_text("#!/bin/sh\npwd\nread line || echo no-stdin >&2\nexit 3\n")
    script.chmod(0o755)
    assert runtime.run_binary([str(script)], 10) == (3, "/\n", "no-stdin\n", None)
    returncode, stdout, stderr, error = runtime.run_binary([str(tmp_path / "missing")], 10)
    assert returncode is None and "No such file" in error
    slow = tmp_path / "slow"
    slow.write_text("#!/bin/sh\nsleep 5\n")
    slow.chmod(0o755)
    assert runtime.run_binary([str(slow)], 1) == (None, "", "", "timed out after 1 s")


def test_start_binary_starts_a_server_the_same_way(tmp_path):
    """The completion probe's server starts as run_binary runs a check: cwd /, no stdin, stderr with stdout."""
    script = tmp_path / "server"
    script.write_text("#!/bin/sh\npwd\nread line || echo no-stdin >&2\nexit 4\n")
    script.chmod(0o755)
    log = tmp_path / "log"
    with open(log, "w+") as handle:
        assert runtime.start_binary([str(script)], handle).wait(timeout=10) == 4
    assert log.read_text() == "/\nno-stdin\n"
