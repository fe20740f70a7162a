"""The gateway's core on real registry files: which replicas are servers (Ready and whole by the registry's and
the solver's own rules, never draining), the configuration's routing, error and timeout lines, the key map,
the Prometheus targets, and the refusal of every unsafe name."""

import json
import shutil
import subprocess

import pytest

from ansible_collections.llmgw.fleet.plugins.module_utils import gateway_config as gc
from ansible_collections.llmgw.fleet.plugins.module_utils.fleet_registry import FleetRegistry

KEY = "sk-unit-0123456789abcdef"


@pytest.fixture
def registry(tmp_path):
    with FleetRegistry(str(tmp_path / "fleet.db")) as reg:
        for name, fabric, address in (("node01", "ib-a", "10.77.0.11"), ("node02", "ib-a", "10.77.0.12"),
                                      ("node03", "ib-b", "10.77.0.13"), ("node04", "ib-b", "10.77.0.14")):
            reg.put_node(name, fabric=fabric, gpu_count=8, state="ready", address=address)
        yield reg


def replica(reg, name, model, nodes, state="ready", port=8080):
    reg.put_replica(name, model=model, engine="sim", shard_count=len(nodes), gpus_per_shard=4, port=port)
    reg.set_shards(name, [{"rank": r, "node": n, "gpus": [0, 1, 2, 3] if port == 8080 else [4, 5, 6, 7]}
                          for r, n in enumerate(nodes)])
    reg.put_replica(name, state=state)


def test_only_ready_whole_replicas_are_servers(registry):
    replica(registry, "coder-a", "coder", ["node01", "node02"])
    replica(registry, "coder-b", "coder", ["node03", "node04"], state="starting")
    replica(registry, "chat-a", "chat", ["node03"], port=8082)
    routes = gc.read_routes(registry, ["declared"])
    assert routes.models == ["chat", "coder"]
    assert [s.replica for s in routes.served["coder"]] == ["coder-a"]
    assert routes.served["coder"][0].target == "10.77.0.11:8080"  # the leader, rank 0
    assert routes.unavailable == ("declared",)
    assert routes.to_dict()["excluded"] == [
        {"replica": "coder-b", "model": "coder", "why": "state starting, not ready"}]


def test_a_ready_replica_with_a_shard_on_a_lost_node_is_broken_and_not_a_server(registry):
    """The seed's failure: the registry still says ready, the solver says broken; the gateway believes the solver."""
    replica(registry, "coder-a", "coder", ["node01", "node02"])
    registry.put_node("node01", state="lost")  # rank 0's node
    routes = gc.read_routes(registry)
    assert routes.served == {}
    assert routes.unavailable == ("coder",)
    # The solver's one definition of broken, in its own words.
    assert routes.excluded[0]["why"] == "broken: shard not live: rank 0 on node01 (lost); 1 of its 2 shards live"
    config = gc.render(routes, gc.Settings())
    assert "backend model_coder" not in config and "10.77.0.11" not in config
    assert "if { var(txn.model) -m str coder }" in config  # a 503 with Retry-After, not a 404


def test_a_replica_on_a_draining_node_is_drained(registry):
    replica(registry, "coder-a", "coder", ["node01", "node02"])
    replica(registry, "coder-b", "coder", ["node03", "node04"])
    registry.put_node("node04", state="draining")  # a worker's node: the replica goes, not only its leader
    routes = gc.read_routes(registry)
    assert [s.replica for s in routes.served["coder"]] == ["coder-a"]
    assert routes.excluded[0]["why"] == "on draining node node04 (drained: no new requests)"


def test_failed_and_placing_replicas_are_not_servers(registry):
    replica(registry, "coder-a", "coder", ["node01"], state="failed")
    registry.put_replica("coder-b", model="coder", engine="sim", shard_count=1, gpus_per_shard=0)
    routes = gc.read_routes(registry)
    assert routes.served == {} and routes.unavailable == ("coder",)
    assert sorted(e["why"] for e in routes.excluded) == ["state failed, not ready", "state placing, not ready"]


def test_the_configuration_routes_errors_and_timeouts(registry):
    replica(registry, "coder-a", "coder", ["node01", "node02"])
    replica(registry, "coder-b", "coder", ["node03", "node04"], port=8082)
    config = gc.render(gc.read_routes(registry, ["gemma"]), gc.Settings(server_timeout=1200))
    lines = config.splitlines()
    assert "    option http-buffer-request" in lines
    assert "    http-request set-var(txn.model) req.body,json_query('$.model')" in lines
    assert "    acl routed_path path /v1/chat/completions /v1/completions /v1/embeddings" in lines
    assert "    use_backend model_coder if { var(txn.model) -m str coder }" in lines
    assert "    server coder-a 10.77.0.11:8080" in lines and "    server coder-b 10.77.0.13:8082" in lines
    assert "    http-response set-header X-Llmgw-Replica %[srv_name]" in lines
    assert "    default-server check inter 2s fall 2 rise 2 slowstart 30s" in lines
    assert "    option httpchk GET /health" in lines and "    option redispatch 1" in lines
    assert "    retry-on conn-failure empty-response" in lines
    assert "    timeout server 1200s" in lines and "    timeout tunnel 3600s" in lines
    assert "    http-request use-service prometheus-exporter if { path /metrics }" in lines
    assert "    bind 0.0.0.0:8405" in lines and "    bind 0.0.0.0:8000" in lines
    assert "    stats socket /run/haproxy/admin.sock mode 660 level admin expose-fd listeners" in lines
    assert "    http-request del-header authorization" in lines
    assert not any("compression" in line or "capture" in line for line in lines)  # SSE unbuffered; no header logged
    models = next(line for line in lines if "if models_path METH_GET" in line)
    body = json.loads(models.split(" string '", 1)[1].rsplit("'", 1)[0])
    assert body == {"object": "list", "data": [{"id": "coder", "object": "model", "created": 0,
                                               "owned_by": "llmgw-fleet"}]}
    gemma = next(line for line in lines if "-m str gemma }" in line)
    assert "return status 503" in gemma and "hdr Retry-After 10" in gemma
    not_found = next(line for line in lines if "model_not_found" in line)
    assert "the models there are: coder" in not_found and not_found.endswith("unless { var(txn.model) -m str coder }")
    # Deterministic: the same fleet gives the same text (changed only when the fleet changed).
    assert config == gc.render(gc.read_routes(registry, ["gemma"]), gc.Settings(server_timeout=1200))


def test_a_replica_being_removed_is_left_out_and_says_why(registry):
    replica(registry, "coder-a", "coder", ["node01", "node02"])
    replica(registry, "coder-b", "coder", ["node03", "node04"], port=8082)
    routes = gc.read_routes(registry, leave_out=["coder-a"])
    assert [s.replica for s in routes.served["coder"]] == ["coder-b"]
    assert routes.to_dict()["excluded"] == [
        {"replica": "coder-a", "model": "coder", "why": "being removed (drained at the gateway)"}]
    with pytest.raises(gc.GatewayConfigError, match="drain"):
        gc.read_routes(registry, leave_out=["bad name"])


def test_the_configuration_records_its_registry_and_only_its_own_is_read_back(registry):
    config = gc.render(gc.read_routes(registry), gc.Settings(), "/srv/llmgw/fleet.db")
    assert config.splitlines()[1] == "#   registry: /srv/llmgw/fleet.db"
    assert gc.registry_of(config) == "/srv/llmgw/fleet.db"
    assert gc.registry_of(gc.render(gc.read_routes(registry), gc.Settings())) is None
    assert gc.registry_of("global\n    daemon\n") is None and gc.registry_of(None) is None
    with pytest.raises(gc.GatewayConfigError, match="control characters"):
        gc.render(gc.read_routes(registry), gc.Settings(), "/srv/fleet.db\nglobal")


def test_status_names_each_models_endpoints(registry):
    replica(registry, "coder-a", "coder", ["node01", "node02"])
    replica(registry, "coder-b", "coder", ["node03", "node04"], state="starting", port=8082)
    lines = gc.model_lines(gc.read_routes(registry, ["gemma"]), "http://gw.example:8000/")
    assert lines == [
        "MODELS",
        "  coder: 1 Ready replica(s), through the gateway http://gw.example:8000/v1; "
        "leaders http://10.77.0.11:8080 (coder-a)",
        "  gemma: no Ready replica (the gateway answers 503)",
        "  not routed: coder-b (coder): state starting, not ready"]
    assert "--gateway URL" in gc.model_lines(gc.read_routes(registry))[1]


def test_server_sessions_reads_show_stat():
    show_stat = ("# pxname,svname,qcur,qmax,scur,smax,slim,stot\n"
                 "api,FRONTEND,,,3,9,4096,120\n"
                 "model_coder,coder-a,0,0,2,5,,40\n"
                 "model_coder,coder-b,0,0,0,3,,38\n"
                 "model_coder,BACKEND,0,0,2,6,410,78\n\n")
    assert gc.server_sessions(show_stat) == {("model_coder", "coder-a"): 2, ("model_coder", "coder-b"): 0}
    assert gc.server_sessions("Unknown command\n") == {}


def test_tls_binds_the_certificate():
    config = gc.render(gc.routes([], [], gc.placement.Fleet([])), gc.Settings(tls_certificate="/etc/haproxy/gw.pem"))
    assert "    bind 0.0.0.0:8000 ssl crt /etc/haproxy/gw.pem alpn http/1.1" in config.splitlines()
    assert "ssl-min-ver TLSv1.2" in config


@pytest.mark.skipif(shutil.which("haproxy") is None, reason="haproxy is not installed")
def test_haproxy_accepts_the_configuration(registry, tmp_path):
    replica(registry, "coder-a", "coder", ["node01", "node02"])
    keys = tmp_path / "keys.map"
    keys.write_text(gc.keys_map({"team-a": KEY}))
    settings = gc.Settings(keys_path=str(keys), stats_socket=str(tmp_path / "admin.sock"), user=None, group=None,
                           chroot=None, log=None)
    path = tmp_path / "haproxy.cfg"
    path.write_text(gc.render(gc.read_routes(registry, ["gemma"]), settings))
    proc = subprocess.run(["haproxy", "-c", "-f", str(path)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_key_map_holds_digests_and_names_never_keys():
    text = gc.keys_map({"team-b": KEY + "b", "team-a": KEY})
    assert KEY not in text
    assert sorted(text.splitlines()) == sorted(["%s team-a" % gc.key_digest(KEY),
                                                "%s team-b" % gc.key_digest(KEY + "b")])


@pytest.mark.parametrize("keys, field, problem", [
    ({}, "api_keys", "at least one API key"),
    ({"team a": KEY}, "api_keys name", "not a safe key name"),
    ({"team-a": "short"}, "api_keys[team-a]", "at least 16"),
    ({"team-a": KEY + " x"}, "api_keys[team-a]", "without spaces"),
    ({"team-a": KEY, "team-b": KEY}, "api_keys[team-b]", "the same key as api_keys[team-a]"),
])
def test_bad_keys_are_refused_without_showing_the_key(keys, field, problem):
    with pytest.raises(gc.GatewayConfigError) as caught:
        gc.keys_map(keys)
    assert caught.value.field == field and problem in str(caught.value)
    assert KEY not in str(caught.value) and "short" not in str(caught.value)


@pytest.mark.parametrize("model", ["org/model", "a b", "x'y", 'x"y', "-lead", "", "m{x}"])
def test_an_unsafe_model_name_is_refused_naming_field_value_and_fix(registry, model):
    registry.put_replica("coder-a", model=model, engine="sim", shard_count=1, gpus_per_shard=0)
    with pytest.raises(gc.GatewayConfigError) as caught:
        gc.read_routes(registry)
    message = str(caught.value)
    assert caught.value.field == "replicas[coder-a].model" and json.dumps(model) in message
    assert "declare it under that name in fleet_models" in message


def test_an_unsafe_declared_model_or_replica_name_is_refused(registry):
    with pytest.raises(gc.GatewayConfigError, match="fleet_models"):
        gc.read_routes(registry, ["bad name"])
    registry.put_replica("bad#name", model="coder", engine="sim", shard_count=1, gpus_per_shard=0)
    with pytest.raises(gc.GatewayConfigError, match='replicas.name="bad#name": not a safe replica name'):
        gc.read_routes(registry)


def test_an_unsafe_address_is_refused(registry):
    replica(registry, "coder-a", "coder", ["node01"])
    registry.put_node("node01", address="10.0.0.1 backup")
    with pytest.raises(gc.GatewayConfigError, match=r'nodes\[node01\].address="10.0.0.1 backup"'):
        gc.read_routes(registry)


@pytest.mark.parametrize("settings, field", [
    (dict(keys_path="relative.map"), "keys_path"),
    (dict(keys_path="/etc/../x"), "keys_path"),
    (dict(bind_address="example.com"), "bind_address"),
    (dict(port=70000), "port"),
    (dict(metrics_port=8000), "metrics_port"),
    (dict(tls_certificate="/etc/my cert.pem"), "tls_certificate"),
    (dict(log="/dev/log local0\n    stats enable"), "log"),
    (dict(user="root; x"), "user"),
    (dict(server_timeout=0), "server_timeout"),
    (dict(request_buffer=1024), "request_buffer"),
    (dict(health_path="/health check"), "health_path"),
])
def test_bad_settings_are_refused(settings, field):
    with pytest.raises(gc.GatewayConfigError) as caught:
        gc.Settings(**settings).checked()
    assert caught.value.field == field


def test_file_sd_targets(registry):
    replica(registry, "coder-a", "coder", ["node01", "node02"])
    replica(registry, "coder-b", "coder", ["node03", "node04"], state="failed", port=8082)
    groups = json.loads(gc.file_sd(gc.read_routes(registry), "gw.example.internal:8405", 9100, {"fleet": "lab"}))
    assert groups[0] == {"targets": ["gw.example.internal:8405"], "labels": {"job": "llmgw-gateway", "fleet": "lab"}}
    assert groups[1] == {"targets": ["10.77.0.11:8080"], "labels": {
        "job": "llmgw-replica", "model": "coder", "replica": "coder-a", "node": "node01", "fleet": "lab"}}
    nodes = [g for g in groups if g["labels"]["job"] == "llmgw-node"]
    assert [g["targets"] for g in nodes] == [["10.77.0.11:9100"], ["10.77.0.12:9100"], ["10.77.0.13:9100"],
                                             ["10.77.0.14:9100"]]
    assert len(groups) == 6  # the failed replica is not scraped as a leader
    with pytest.raises(gc.GatewayConfigError, match="gateway_target"):
        gc.file_sd(gc.read_routes(registry), "bad host:8405")
