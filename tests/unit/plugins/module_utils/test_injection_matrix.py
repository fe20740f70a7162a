"""Injection strings fed to every place a user's value reaches a systemd unit, an HAProxy configuration or a file
name on the nodes: each is refused (naming the field) or arrives as exactly the value given, one argument.

The units are read back as systemd reads ExecStart= (systemd.syntax(7): words split on unquoted whitespace, double
quotes with C escapes, "%%" for "%" and "$$" for "$"), independently of the quoting code under test. The gateway's
inputs all go through its checks (tests/unit/plugins/module_utils/test_gateway_config.py shows the HAProxy side).
Each string is a row of each sink: 18 strings x 8 sinks. An API key itself may hold any printable character:
only its sha256 reaches the gateway's files.
"""

import re

import pytest

from ansible_collections.llmgw.fleet.plugins.module_utils import gateway_config as gc
from ansible_collections.llmgw.fleet.plugins.module_utils import replica_plan
from ansible_collections.llmgw.fleet.plugins.module_utils.fleet_registry import FleetRegistry

INJECTIONS = [
    "; reboot", "$(touch /tmp/pwned)", "`id`", "a\nExecStartPre=/bin/true", "x' y", 'x" y', "../../etc/passwd",
    "%n%h", "a\tb", "back\\slash", "{{ lookup('pipe', 'id') }}", "x\r\nHTTP/1.1 200 OK", "#comment",
    "-o ProxyCommand=id", "$HOME", "a;b|c&d>e<f", "\\x0a", "é\u202e",
]
VARIABLE = re.compile(r"\$(\{\w+\}|\w+)")
C_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'", "a": "\a", "b": "\b", "f": "\f",
             "v": "\v", "s": " "}


def systemd_words(line):
    """ExecStart='s words as systemd reads them."""
    words, i, text = [], 0, line
    while i < len(text):
        if text[i] in " \t":
            i += 1
            continue
        word, quoted = "", text[i] == '"'
        i += 1 if quoted else 0
        while i < len(text) and (quoted and text[i] != '"' or not quoted and text[i] not in " \t"):
            if text[i] == "\\" and quoted:
                nxt = text[i + 1]
                if nxt == "x":
                    word += chr(int(text[i + 2:i + 4], 16))
                    i += 4
                else:
                    word += C_ESCAPES[nxt]
                    i += 2
                continue
            word += text[i]
            i += 1
        i += 1 if quoted else 0
        words.append(expand(word))
    return words


def expand(word):
    """What systemd makes of "%" and "$" in a word: "%%" and "$$" are themselves, any other "%x" a specifier and
    "$NAME" / "${NAME}" a variable, each shown here as a marker the value under test cannot hold."""
    out, i = "", 0
    while i < len(word):
        pair = word[i:i + 2]
        if pair in ("%%", "$$"):
            out, i = out + pair[0], i + 2
        elif word[i] == "%" and i + 1 < len(word):
            out, i = out + "<specifier>", i + 2
        elif VARIABLE.match(word, i):
            out, i = out + "<variable>", VARIABLE.match(word, i).end()
        else:
            out, i = out + word[i], i + 1
    return out


def exec_start(text):
    lines = [line for line in text.splitlines() if line.startswith("ExecStart=")]
    assert len(lines) == 1, text
    assert [line for line in text.splitlines() if line.startswith("[")] == ["[Unit]", "[Service]", "[Install]"]
    return systemd_words(lines[0][len("ExecStart="):])


def replica(**extra):
    record = {"name": "coder-a", "engine": "sim", "model": "sim-coder", "shard_count": 1, "gpus_per_shard": 1,
              "port": None, "options": {}, "state": "placing",
              "shards": [{"rank": 0, "node": "node01", "address": "10.77.0.131", "gpus": [0], "fabric": "ib-a"}]}
    record.update(extra)
    return record


@pytest.fixture
def registry(tmp_path):
    with FleetRegistry(str(tmp_path / "fleet.db")) as reg:
        reg.put_node("node01", fabric="ib-a", gpu_count=8, state="ready", address="10.77.0.11")
        yield reg


def ready_replica(reg, name="coder-a", model="coder"):
    reg.put_replica(name, model=model, engine="sim", shard_count=1, gpus_per_shard=1, port=8080)
    reg.set_shards(name, [{"rank": 0, "node": "node01", "gpus": [0]}])
    reg.put_replica(name, state="ready")


def passes_whole(value, words):
    assert value in words, (value, words)


def refused(call, *fragments):
    with pytest.raises((gc.GatewayConfigError, replica_plan.ReplicaPlanError)) as caught:
        call()
    for fragment in fragments:
        assert fragment in str(caught.value), (fragment, str(caught.value))


@pytest.mark.parametrize("value", INJECTIONS)
def test_a_model_name_reaches_the_unit_as_one_argument(value):
    passes_whole(value, exec_start(replica_plan.plan_units(replica(model=value))["units"][0]["unit_text"]))


@pytest.mark.parametrize("value", INJECTIONS)
def test_a_model_path_reaches_the_unit_as_one_argument(value):
    path = "/var/lib/llmgw/models/" + value
    plan = replica_plan.plan_units(replica(engine="llama.cpp", model="coder"), model_path=path, engine_dir="/opt/e")
    passes_whole(path, exec_start(plan["units"][0]["unit_text"]))


@pytest.mark.parametrize("value", INJECTIONS)
def test_an_engine_argument_of_a_node_reaches_the_unit_as_one_argument(value):
    shards = [{"rank": 0, "node": "node01", "address": "10.77.0.131", "gpus": [0], "fabric": "ib-a",
               "engine_args": ["--tag", value]}]
    plan = replica_plan.plan_units(replica(engine="llama.cpp", model="coder", shards=shards), engine_dir="/opt/e")
    passes_whole(value, exec_start(plan["units"][0]["unit_text"]))


@pytest.mark.parametrize("value", INJECTIONS)
def test_a_replica_name_is_refused(value):
    refused(lambda: replica_plan.plan_units(replica(name="coder" + value)), "replica name")


@pytest.mark.parametrize("value", INJECTIONS)
def test_a_model_name_at_the_gateway_is_refused(registry, value):
    ready_replica(registry, model="coder" + value)
    refused(lambda: gc.read_routes(registry), "replicas[coder-a].model")


@pytest.mark.parametrize("value", INJECTIONS)
def test_a_node_address_at_the_gateway_is_refused(registry, value):
    ready_replica(registry)
    registry.put_node("node01", address="10.77.0.11" + value)
    refused(lambda: gc.read_routes(registry), "nodes[node01].address")


@pytest.mark.parametrize("value", INJECTIONS)
def test_an_api_key_name_is_refused_and_a_key_never_reaches_the_gateway(value):
    refused(lambda: gc.keys_map({"team" + value: "sk-unit-0123456789abcdef"}), "api_keys name")
    key = "sk-unit-0123456789abcdef" + value
    try:
        text = gc.keys_map({"team-a": key})
    except gc.GatewayConfigError as caught:
        assert "api_keys[team-a]" in str(caught) and key not in str(caught)
        return
    assert re.match(r"^[0-9a-f]{64} team-a\n$", text), text  # only the key's sha256 is written
