"""The gateway for real, on loopback and without the lab: Debian's HAProxy (a process of this test in a temporary
directory, on high ports, not the system service) in front of backends on 127.0.0.1 -- the collection's simulated
engine, and small OpenAI-shaped servers that stream SSE token by token -- with its configuration written by the
``gateway_config`` module through ansible-playbook from a real registry file.

Checks: routing by model, ``/v1/models``, every error shape (401 without and with a wrong key, 404 naming the
models, 503 with Retry-After, 400 without a model, 404 for an unknown URL), SSE arriving as it is generated, a
server failing ``/health`` never routed to, a replica the registry does not call Ready never routed to, the key
never in the log, and a reload (USR2 to the master, as ``systemctl reload haproxy`` does; and ``haproxy -sf``)
under a streaming request that drops no stream. All traffic goes to 127.0.0.1.
"""

import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from helpers import free_ports, gateway_server_states

from ansible_collections.llmgw.fleet.plugins.module_utils import gateway_config
from ansible_collections.llmgw.fleet.plugins.module_utils.fleet_registry import FleetRegistry

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SIM_ENGINE = os.path.join(REPO, "roles", "replica", "files", "llmgw-sim-engine.py")
HAPROXY = shutil.which("haproxy") or ("/usr/sbin/haproxy" if os.path.exists("/usr/sbin/haproxy") else None)
KEY = "sk-loopback-0123456789abcdef"
WRONG_KEY = "sk-loopback-not-the-key-000000"

pytestmark = pytest.mark.skipif(HAPROXY is None, reason="haproxy is not installed (tests/lab/apt-packages.txt)")


class QuietServer(ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        """HAProxy closing an idle keep-alive connection is not an error of the test."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class Backend:
    """An OpenAI-shaped server on 127.0.0.1: /health (healthy or not), /v1/chat/completions (JSON, or SSE one
    token every ``delay`` seconds), /v1/embeddings. Counts the inference requests it was sent."""

    def __init__(self, replica, healthy=True, delay=0.25):
        self.replica, self.healthy, self.delay = replica, healthy, delay
        self.requests = 0
        self.lock = threading.Lock()
        backend = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, fmt, *args):
                pass

            def send_json(self, status, body):
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path == "/health":
                    self.send_json(200 if backend.healthy else 503,
                                   {"status": "ok" if backend.healthy else "loading model"})
                else:
                    self.send_json(404, {"error": "not found"})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                with backend.lock:
                    backend.requests += 1
                if self.path == "/v1/embeddings":
                    self.send_json(200, {"object": "list", "model": body.get("model"), "replica": backend.replica,
                                         "data": [{"object": "embedding", "index": 0, "embedding": [0.1, 0.2]}]})
                    return
                tokens = int(body.get("max_tokens") or 4)
                if not body.get("stream"):
                    self.send_json(200, {"object": "chat.completion", "model": body.get("model"),
                                         "replica": backend.replica, "authorization": self.headers.get(
                                             "Authorization"), "choices": [{"index": 0, "message": {
                                                 "role": "assistant", "content": " ".join(["tok"] * tokens)}}]})
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for i in range(tokens):
                    event = {"object": "chat.completion.chunk", "replica": backend.replica, "index": i,
                             "sent_at": time.time(), "choices": [{"index": 0, "delta": {"content": "tok%d " % i}}]}
                    self.chunk("data: %s\n\n" % json.dumps(event))
                    time.sleep(backend.delay)
                self.chunk("data: [DONE]\n\n")
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()

            def chunk(self, text):
                data = text.encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()

        self.server = QuietServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def read(path):
    with open(path) as handle:
        return handle.read()


def wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError("timed out after %ss waiting for %s" % (timeout, what))


def answers(port, path="/health"):
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        conn.request("GET", path)
        return conn.getresponse().status == 200
    except OSError:
        return False


def request(port, method, path, body=None, key=KEY, timeout=10):
    """(status, headers, parsed JSON body)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = "Bearer " + key
    conn.request(method, path, body=json.dumps(body) if body is not None else None, headers=headers)
    response = conn.getresponse()
    data = response.read()
    conn.close()
    return response.status, {k.lower(): v for k, v in response.getheaders()}, json.loads(data) if data else None


def stream(port, model, tokens, events, started=None):
    """A streamed chat completion; appends (arrival time, event) to ``events``; returns the final status."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("POST", "/v1/chat/completions", body=json.dumps({
        "model": model, "stream": True, "max_tokens": tokens, "messages": [{"role": "user", "content": "hi"}]}),
        headers={"Authorization": "Bearer " + KEY, "Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.getheader("Content-Type") == "text/event-stream"
    while True:
        line = response.readline()
        if not line:
            break
        line = line.decode().strip()
        if not line.startswith("data: "):
            continue
        events.append((time.time(), line[len("data: "):]))
        if started is not None:
            started.set()
        if line == "data: [DONE]":
            break
    conn.close()
    return response.status


def run_module(directory, db, settings, check=False, **more):
    """gateway_config through ansible-playbook (the real adapter), as the role runs it."""
    args = dict(db=db, api_keys={"team-a": KEY}, models=["gemma3-270m"], validate=HAPROXY + " -c -q -f %s",
                config_path=os.path.join(directory, "haproxy.cfg"),
                targets_path=os.path.join(directory, "targets.json"),
                gateway_target="127.0.0.1:%d" % settings["metrics_port"], node_exporter_port=9100, **settings)
    args.update(more)
    play = [{"hosts": "localhost", "gather_facts": False,
             "tasks": [{"name": "gateway", "llmgw.fleet.gateway_config": args, "register": "gw"}]}]
    path = os.path.join(directory, "play.json")
    with open(path, "w") as handle:
        json.dump(play, handle)
    env = dict(os.environ, ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json", ANSIBLE_LOCALHOST_WARNING="False",
               ANSIBLE_INVENTORY_UNPARSED_WARNING="False", ANSIBLE_NOCOLOR="1",
               ANSIBLE_COLLECTIONS_PATH=os.path.join(REPO, ".build", "collections"))
    env.pop("PYTHONPATH", None)
    argv = [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", "localhost,", "-c", "local",
            "-e", "ansible_python_interpreter=" + sys.executable, "--diff", path] + (["--check"] if check else [])
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout[proc.stdout.index("{"):])
    return report["plays"][0]["tasks"][0]["hosts"]["localhost"], proc.stdout + proc.stderr


def seed_registry(db, ports):
    with FleetRegistry(db) as reg:
        for node in ("gw-node01", "gw-node02", "gw-node03", "gw-node04", "gw-node05"):
            reg.put_node(node, fabric="lo", gpu_count=0, state="ready", address="127.0.0.1")
        for name, model, node, state in (("coder-a", "sim-coder", "gw-node01", "ready"),
                                         ("chat-a", "chat", "gw-node02", "ready"),
                                         ("chat-b", "chat", "gw-node03", "ready"),
                                         ("chat-c", "chat2", "gw-node04", "starting"),
                                         ("gemma-a", "gemma3-270m", "gw-node05", "failed")):
            reg.put_replica(name, model=model, engine="sim", shard_count=1, gpus_per_shard=0, port=ports[name])
            reg.set_shards(name, [{"rank": 0, "node": node, "gpus": []}])
            reg.put_replica(name, state=state)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("gateway"))
    backends = {"chat-a": Backend("chat-a"), "chat-b": Backend("chat-b", healthy=False),
                "chat-c": Backend("chat-c"), "gemma-a": Backend("gemma-a")}
    sim_port, api_port, metrics_port = free_ports(3)
    sim = subprocess.Popen([sys.executable, SIM_ENGINE, "--replica", "coder-a", "--model", "sim-coder", "--rank", "0",
                            "--shards", "1", "--bind", "127.0.0.1", "--host", "127.0.0.1", "--port", str(sim_port)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ports = {name: b.port for name, b in backends.items()}
    ports["coder-a"] = sim_port
    db = os.path.join(directory, "fleet.db")
    seed_registry(db, ports)
    settings = dict(keys_path=os.path.join(directory, "api-keys.map"), bind_address="127.0.0.1", port=api_port,
                    metrics_address="127.0.0.1", metrics_port=metrics_port,
                    stats_socket=os.path.join(directory, "admin.sock"), log="stderr local0", user="", group="",
                    chroot="", health_interval=1, slowstart=2, retry_after=7)
    checked, check_out = run_module(directory, db, settings, check=True)
    applied, apply_out = run_module(directory, db, settings)
    again, _again_out = run_module(directory, db, settings)
    log_path = os.path.join(directory, "haproxy.log")
    log = open(log_path, "w")  # noqa: SIM115 - HAProxy writes to it until the fixture ends
    master = subprocess.Popen([HAPROXY, "-W", "-db", "-f", os.path.join(directory, "haproxy.cfg"),
                               "-p", os.path.join(directory, "haproxy.pid")], stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: answers(settings["port"]), 20, "HAProxy on 127.0.0.1:%d" % settings["port"])
        wait_for(lambda: answers(sim_port), 20, "the simulated engine")
        # Nothing is asked before the active checks have seen chat-b fail its /health.
        wait_for(lambda: gateway_server_states(settings["stats_socket"]).get(("model_chat", "chat-b")) == "DOWN", 20,
                 "chat-b DOWN by its health check")
        yield dict(directory=directory, db=db, ports=ports, settings=settings, backends=backends, master=master,
                   port=settings["port"], log_path=log_path, checked=checked, applied=applied, again=again,
                   ansible_output=check_out + apply_out)
    finally:
        master.terminate()
        master.wait(timeout=20)
        log.close()
        sim.terminate()
        sim.wait(timeout=10)
        for backend in backends.values():
            backend.close()


def test_module_check_then_apply_then_nothing_to_do(gateway):
    checked, applied, again = gateway["checked"], gateway["applied"], gateway["again"]
    assert checked["changed"] and applied["changed"] and not again["changed"], (checked, applied, again)
    assert applied["models"] == ["chat", "sim-coder"]
    assert applied["unavailable_models"] == ["chat2", "gemma3-270m"]
    assert sorted(s["replica"] for s in applied["backends"]["chat"]) == ["chat-a", "chat-b"]
    assert {e["replica"]: e["why"] for e in applied["excluded"]} == {
        "chat-c": "state starting, not ready", "gemma-a": "state failed, not ready"}
    assert oct(os.stat(gateway["settings"]["keys_path"]).st_mode & 0o777) == "0o600"
    assert KEY not in read(gateway["settings"]["keys_path"])
    assert KEY not in gateway["ansible_output"]
    targets = json.loads(read(os.path.join(gateway["directory"], "targets.json")))
    jobs = sorted((g["labels"]["job"], g["labels"].get("replica", g["labels"].get("node", ""))) for g in targets)
    assert ("llmgw-gateway", "") in jobs and ("llmgw-replica", "coder-a") in jobs
    assert ("llmgw-node", "gw-node05") in jobs
    assert ("llmgw-replica", "chat-c") not in jobs


def test_models_lists_only_models_with_a_ready_replica(gateway):
    status, _headers, body = request(gateway["port"], "GET", "/v1/models")
    assert status == 200
    assert body["object"] == "list"
    assert [m["id"] for m in body["data"]] == ["chat", "sim-coder"]
    assert all(m["object"] == "model" for m in body["data"])


def test_routes_by_the_body_model(gateway):
    status, _headers, body = request(gateway["port"], "POST", "/v1/completions",
                                     {"prompt": "hello", "max_tokens": 3, "model": "sim-coder"})
    assert status == 200, body
    assert body["choices"][0]["text"] == "sim coder-a rank0+0: tok tok tok"
    status, _headers, body = request(gateway["port"], "POST", "/v1/chat/completions",
                                     {"messages": [{"role": "user", "content": "x"}], "model": "chat"})
    assert status == 200 and body["replica"] == "chat-a", body
    assert body["authorization"] is None  # the gateway's key never reaches a node
    status, _headers, body = request(gateway["port"], "POST", "/v1/embeddings", {"model": "chat", "input": "x"})
    assert status == 200 and body["replica"] == "chat-a", body


def test_error_shapes(gateway):
    port = gateway["port"]
    ask = {"model": "chat", "messages": []}
    status, headers, body = request(port, "POST", "/v1/chat/completions", ask, key=None)
    assert status == 401 and headers["www-authenticate"] == "Bearer"
    assert body["error"]["code"] == "missing_api_key" and "Authorization: Bearer" in body["error"]["message"]
    status, headers, body = request(port, "POST", "/v1/chat/completions", ask, key=WRONG_KEY)
    assert status == 401 and body["error"] == {"message": "Incorrect API key provided", "type": "invalid_request_error",
                                               "param": None, "code": "invalid_api_key"}
    status, _headers, body = request(port, "GET", "/v1/models", key=WRONG_KEY)
    assert status == 401
    status, _headers, body = request(port, "POST", "/v1/chat/completions", {"model": 'no"such', "messages": []})
    assert status == 404 and body["error"]["code"] == "model_not_found" and body["error"]["param"] == "model"
    # The client's model went through HAProxy's json converter: the body is still valid JSON.
    assert body["error"]["message"] == 'The model "no"such" does not exist; the models there are: chat, sim-coder'
    for model in ("gemma3-270m", "chat2"):  # a failed replica, a starting one: known, not servable
        status, headers, body = request(port, "POST", "/v1/chat/completions", {"model": model, "messages": []})
        assert status == 503 and headers["retry-after"] == "7", (model, body)
        assert body["error"]["code"] == "model_not_ready" and model in body["error"]["message"]
    status, _headers, body = request(port, "POST", "/v1/chat/completions", {"messages": []})
    assert status == 400 and body["error"]["code"] == "missing_model"
    status, _headers, body = request(port, "GET", "/v1/files")
    assert status == 404 and body["error"]["code"] == "unknown_url"
    assert gateway["backends"]["chat-c"].requests == 0 and gateway["backends"]["gemma-a"].requests == 0


def test_a_server_failing_its_health_check_gets_nothing(gateway):
    before = gateway["backends"]["chat-a"].requests
    for _i in range(12):
        status, _headers, body = request(gateway["port"], "POST", "/v1/chat/completions",
                                         {"model": "chat", "messages": []})
        assert status == 200 and body["replica"] == "chat-a"
    assert gateway["backends"]["chat-a"].requests == before + 12
    assert gateway["backends"]["chat-b"].requests == 0
    # The control: once chat-b passes its checks (rise 2, then slowstart) it is routed to like any other.
    gateway["backends"]["chat-b"].healthy = True
    sock = gateway["settings"]["stats_socket"]
    wait_for(lambda: gateway_server_states(sock).get(("model_chat", "chat-b")) == "UP", 20,
             "chat-b UP again")
    time.sleep(2.5)  # slowstart
    ask = {"model": "chat", "messages": []}
    replicas = [request(gateway["port"], "POST", "/v1/chat/completions", ask)[2]["replica"] for _i in range(12)]
    assert "chat-b" in replicas and gateway["backends"]["chat-b"].requests > 0, replicas


def test_sse_arrives_as_it_is_generated(gateway):
    events = []
    started = time.time()
    assert stream(gateway["port"], "chat", 6, events) == 200
    assert events[-1][1] == "[DONE]" and len(events) == 7
    first, last = events[0][0], events[-1][0]
    # 6 tokens 0.25 s apart: buffered, every event would arrive together at the end.
    assert first - started < 1.0 and last - first >= 1.0, [round(t - started, 2) for t, _e in events]
    gaps = [b[0] - a[0] for a, b in zip(events, events[1:-1])]
    assert min(gaps) > 0.1, gaps


def test_the_key_is_never_logged_but_its_name_is(gateway):
    request(gateway["port"], "POST", "/v1/chat/completions", {"model": "chat", "messages": []})
    time.sleep(0.5)
    log = read(gateway["log_path"])
    assert "client=team-a model=chat" in log
    assert KEY not in log and WRONG_KEY not in log


def _stream_in_thread(port, model, tokens):
    events, started, result = [], threading.Event(), {}

    def go():
        try:
            result["status"] = stream(port, model, tokens, events, started)
        except Exception as exc:  # noqa: BLE001 - reported by the test
            result["error"] = repr(exc)

    thread = threading.Thread(target=go)
    thread.start()
    assert started.wait(10), result
    return thread, events, result


def test_reload_by_usr2_under_a_stream_drops_nothing_and_follows_the_registry(gateway):
    """What ``systemctl reload haproxy`` does on Debian (master-worker, SIGUSR2), after the registry changed."""
    port = gateway["port"]
    assert request(port, "POST", "/v1/chat/completions", {"model": "chat2", "messages": []})[0] == 503
    thread, events, result = _stream_in_thread(port, "chat", 12)
    with FleetRegistry(gateway["db"]) as reg:
        reg.put_replica("chat-c", state="ready")
    applied, _out = run_module(gateway["directory"], gateway["db"], gateway["settings"])
    assert applied["config_changed"] and applied["models"] == ["chat", "chat2", "sim-coder"]
    gateway["master"].send_signal(signal.SIGUSR2)
    wait_for(lambda: "chat2" in [m["id"] for m in request(port, "GET", "/v1/models")[2]["data"]], 20,
             "the reloaded worker")
    status, _headers, body = request(port, "POST", "/v1/chat/completions", {"model": "chat2", "messages": []})
    assert status == 200 and body["replica"] == "chat-c"
    thread.join(30)
    assert result == {"status": 200}
    assert [e for _t, e in events][-1] == "[DONE]" and len(events) == 13, events


def test_reloads_under_load_never_answer_503_while_every_server_is_up(gateway):
    """Forty reloads (USR2) 0.25 s apart under two clients, each request on a new connection: every answer is a 200.
    A frontend rule on nbsrv() answered about one request in four reloads with a 503 here (HAProxy 2.6)."""
    port, outcomes, stop = gateway["port"], [], threading.Event()
    ask = {"model": "sim-coder", "prompt": "x", "max_tokens": 1}

    def client():
        while not stop.is_set():
            try:
                status, _headers, body = request(port, "POST", "/v1/completions", ask)
                outcomes.append((status, None if status == 200 else body))
            except (OSError, http.client.HTTPException, ValueError) as exc:
                outcomes.append((None, repr(exc)))

    threads = [threading.Thread(target=client) for _i in range(2)]
    for thread in threads:
        thread.start()
    try:
        for _i in range(40):
            time.sleep(0.25)
            gateway["master"].send_signal(signal.SIGUSR2)
        time.sleep(0.5)
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
    failed = [o for o in outcomes if o[0] != 200]
    assert len(outcomes) > 200 and not failed, (len(outcomes), failed[:5])


def test_a_model_with_no_server_passing_its_check_gets_a_fast_503(gateway):
    """Both of chat's servers failing /health: HAProxy's own 503, in the API's shape, with Retry-After, at once."""
    port, sock, backends = gateway["port"], gateway["settings"]["stats_socket"], gateway["backends"]
    try:
        for name in ("chat-a", "chat-b"):
            backends[name].healthy = False
        wait_for(lambda: {gateway_server_states(sock).get(("model_chat", s)) for s in ("chat-a", "chat-b")} == {
            "DOWN"}, 20, "chat-a and chat-b DOWN by their health checks")
        before = backends["chat-a"].requests + backends["chat-b"].requests
        started = time.monotonic()
        status, headers, body = request(port, "POST", "/v1/chat/completions", {"model": "chat", "messages": []})
        assert time.monotonic() - started < 1.0
        assert status == 503 and headers["retry-after"] == "7" and headers["content-type"] == "application/json"
        assert body["error"] == {"code": "model_not_ready", "param": "model", "type": "server_error",
                                 "message": "The model chat has no replica passing its health check now; "
                                            "retry later"}
        assert backends["chat-a"].requests + backends["chat-b"].requests == before
    finally:
        for name in ("chat-a", "chat-b"):
            backends[name].healthy = True
    wait_for(lambda: gateway_server_states(sock).get(("model_chat", "chat-a")) == "UP", 20, "chat-a UP again")


def test_reload_with_sf_under_a_stream_drops_nothing(gateway, tmp_path):
    """The old-style reload: a new process takes the port and tells the old one (-sf) to finish its streams."""
    api_port, metrics_port = free_ports(2)
    settings = dict(gateway["settings"], port=api_port, metrics_port=metrics_port,
                    stats_socket=str(tmp_path / "sf.sock"))
    with FleetRegistry(gateway["db"]) as reg:
        fleet_routes = gateway_config.read_routes(reg, ["gemma3-270m"])
    core_settings = gateway_config.Settings(**{k: (None if v == "" else v) for k, v in settings.items()})
    config = tmp_path / "sf.cfg"
    config.write_text(gateway_config.render(fleet_routes, core_settings))
    old = subprocess.Popen([HAPROXY, "-db", "-f", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    new = None
    try:
        wait_for(lambda: answers(settings["port"]), 20, "the first HAProxy")
        thread, events, result = _stream_in_thread(settings["port"], "chat", 10)
        new = subprocess.Popen([HAPROXY, "-db", "-f", str(config), "-sf", str(old.pid)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        thread.join(30)
        assert result == {"status": 200}
        assert len(events) == 11 and events[-1][1] == "[DONE]"
        old.wait(timeout=20)  # the old process left once its last stream ended
        assert request(settings["port"], "GET", "/v1/models")[0] == 200  # the new one serves
        assert new.poll() is None
    finally:
        for proc in (new, old):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=20)


def test_a_replica_being_removed_is_drained_its_stream_finishing_first(gateway):
    """What removal does before the units stop: the server set to drain on the runtime API (no new request), the
    module waiting until the stream in flight on it has ended, then the configuration written without it."""
    port, sock = gateway["port"], gateway["settings"]["stats_socket"]
    # chat-b failing its checks again (an earlier test made it healthy): chat-a is then the one server.
    gateway["backends"]["chat-b"].healthy = False
    wait_for(lambda: gateway_server_states(sock).get(("model_chat", "chat-b")) == "DOWN", 20,
             "chat-b DOWN by its health check")
    thread, events, result = _stream_in_thread(port, "chat", 12)
    drained, _out = run_module(gateway["directory"], gateway["db"], gateway["settings"], drain=["chat-a"],
                               drain_timeout=60)
    returned = time.time()
    try:
        thread.join(30)
        assert result == {"status": 200}
        assert events[-1][1] == "[DONE]" and len(events) == 13, events  # the stream was not cut
        assert events[-1][0] <= returned, "the module returned before the stream in flight had ended"
        (entry,) = drained["drained"]
        assert entry["replica"] == "chat-a" and entry["backend"] == "model_chat" and entry["sessions"] == 0
        assert entry["waited"] >= 1.0, entry  # it waited for the stream (12 events, 0.25 s apart)
        assert gateway_server_states(sock)[("model_chat", "chat-a")] == "DRAIN"
        assert {"replica": "chat-a", "model": "chat", "why": "being removed (drained at the gateway)"} in \
            drained["excluded"]
        with open(os.path.join(gateway["directory"], "haproxy.cfg")) as handle:
            assert "server chat-a " not in handle.read()
    finally:
        gateway["backends"]["chat-b"].healthy = True
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.connect(sock)
            conn.sendall(b"set server model_chat/chat-a state ready\n")
            conn.recv(4096)
        run_module(gateway["directory"], gateway["db"], gateway["settings"])
