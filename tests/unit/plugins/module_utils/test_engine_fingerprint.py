"""The digest that decides whether a re-run repeats the engine checks: every part it claims to cover changes it."""

import hashlib
import os
import shutil

import pytest

from ansible_collections.llmgw.fleet.plugins.module_utils.engines import fingerprint

ROLE = os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "roles", "engine")
CPUINFO = """processor\t: 0
model name\t: Example CPU @ 3.0GHz
flags\t\t: fpu sse4_2 avx2 fma avx
processor\t: 1
model name\t: Example CPU @ 3.0GHz
flags\t\t: fpu sse4_2 avx2 fma avx
"""


@pytest.fixture
def engine(tmp_path):
    """An engine directory with a real dynamically linked binary under the launcher's name, and a library."""
    directory = tmp_path / "engine"
    directory.mkdir()
    shutil.copy(shutil.which("true"), directory / "llama-server")
    (directory / "libggml-cpu-x64.so").write_bytes(b"not really a library")
    (directory / ".llmgw-archive.sha256").write_text("ab" * 32 + "\n")
    (tmp_path / "probe.gguf").write_bytes(b"GGUF probe")
    os.symlink(str(directory), str(tmp_path / "current"))
    return directory


def take(engine, cpuinfo=CPUINFO, vcpus=4, options=None):
    return fingerprint.parts(str(engine), str(engine.parent / "probe.gguf"), str(engine.parent / "current"),
                             options or {"floor": "sse42"}, cpuinfo, vcpus)


def test_the_same_node_gives_the_same_digest_and_every_part_is_filled(engine):
    first, second = take(engine), take(engine)
    assert fingerprint.digest(first) == fingerprint.digest(second)
    assert fingerprint.changed_parts(first, second) == []
    assert set(first) == set(fingerprint.PARTS)
    assert set(first["engine_files"]) == {"llama-server", "libggml-cpu-x64.so", ".llmgw-archive.sha256"}
    assert any(name.startswith("libc.so") for name in first["libraries"]), first["libraries"]
    assert first["cpu"] == {"model": "Example CPU @ 3.0GHz", "flags": "avx avx2 fma fpu sse4_2", "vcpus": 4}
    assert first["link"] == str(engine)


@pytest.mark.parametrize("change, part", [
    (lambda e: (e / "llama-server").write_bytes(b"#!/bin/sh\n"), "engine_files"),
    (lambda e: (e / "libggml-cpu-zen4.so").write_bytes(b"another variant"), "engine_files"),
    (lambda e: (e.parent / "probe.gguf").write_bytes(b"GGUF other"), "probe_model"),
    (lambda e: (os.unlink(str(e.parent / "current")), os.symlink("/elsewhere", str(e.parent / "current"))), "link"),
])
def test_a_changed_file_changes_its_part(engine, change, part):
    before = take(engine)
    change(engine)
    after = take(engine)
    assert part in fingerprint.changed_parts(before, after)
    assert fingerprint.digest(before) != fingerprint.digest(after)


def test_the_record_file_itself_is_not_part_of_the_digest(engine):
    before = take(engine)
    fingerprint.write_record(str(engine), {"digest": fingerprint.digest(before), "parts": before, "report": {}})
    assert fingerprint.digest(take(engine)) == fingerprint.digest(before)


def test_another_cpu_type_or_vcpu_count_or_option_changes_the_digest(engine):
    before = take(engine)
    kvm64 = CPUINFO.replace("Example CPU @ 3.0GHz", "Common KVM processor").replace(" sse4_2 avx2 fma avx", "")
    assert fingerprint.changed_parts(before, take(engine, cpuinfo=kvm64)) == ["cpu"]
    assert fingerprint.changed_parts(before, take(engine, vcpus=1)) == ["cpu"]
    assert fingerprint.changed_parts(before, take(engine, options={"floor": "haswell"})) == ["options"]


def test_a_library_that_goes_missing_changes_the_libraries_part(engine):
    before = take(engine)
    libraries = dict(before["libraries"])
    # What ldd prints for libgomp once it is gone; the parser's own output for it.
    found = fingerprint.resolved("\tlibgomp.so.1 => not found\n\tlibc.so.6 => /lib/libc.so.6 (0x1)\n")
    assert found == {"libgomp.so.1": "not found", "libc.so.6": "/lib/libc.so.6"}
    libraries["libgomp.so.1"] = "not found"
    assert fingerprint.changed_parts(before, dict(before, libraries=libraries)) == ["libraries"]


def test_a_record_round_trips_and_a_broken_one_reads_as_none(engine):
    assert fingerprint.read_record(str(engine)) == {}
    fingerprint.write_record(str(engine), {"digest": "d", "report": {"ready": True}})
    assert fingerprint.read_record(str(engine)) == {"digest": "d", "report": {"ready": True}}
    assert oct(os.stat(str(engine / fingerprint.RECORD)).st_mode & 0o777) == "0o644"
    (engine / fingerprint.RECORD).write_text("{not json")
    assert fingerprint.read_record(str(engine)) == {}


def test_the_roles_probe_model_digest_matches_the_shipped_file():
    import yaml

    with open(os.path.join(ROLE, "vars", "main.yml")) as handle:
        declared = yaml.safe_load(handle)["engine_probe_model_sha256"]
    with open(os.path.join(ROLE, "files", "llmgw-probe-q4_0.gguf"), "rb") as handle:
        assert hashlib.sha256(handle.read()).hexdigest() == declared
