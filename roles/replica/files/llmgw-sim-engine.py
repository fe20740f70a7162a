# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The simulated engine: a multi-node replica without GPUs, faithful in what a launch sequence exercises.

Rank 0 (the leader) binds a rendezvous port on its fabric address and serves no HTTP at all until every other
rank has joined; then it answers ``GET /health`` and ``POST /v1/completions`` (a fixed-format text naming the
replica and its shards). Ranks 1..N-1 connect to the rendezvous, join, and serve nothing. Each side pings the
other. The leader ends with an error when a worker goes quiet (a node lost), as a collective that lost a rank
would, so systemd shows the shard failed. A worker whose leader is gone keeps running and waits to join again,
as llama.cpp's RPC server does: that is the half-replica a controller must not adopt as ready.

    llmgw-sim-engine.py --replica coder-a --model sim-coder --rank 0 --shards 2 --leader 10.77.0.131:8081 \
        --bind 10.77.0.131 --host 0.0.0.0 --port 8080

Standard library only; run it with the node's python3 (the unit's ExecStart does).
"""

import argparse
import json
import os
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PING_EVERY = 2.0
PEER_TIMEOUT = 10.0


def log(message):
    sys.stdout.write("llmgw-sim: %s\n" % message)
    sys.stdout.flush()


def die(message):
    log("fatal: " + message)
    sys.stdout.flush()
    os._exit(1)


def parse_args(argv=None):
    env = os.environ.get
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--replica", default=env("LLMGW_REPLICA"), required=env("LLMGW_REPLICA") is None)
    parser.add_argument("--model", default=env("LLMGW_MODEL", "sim"))
    parser.add_argument("--rank", type=int, default=int(env("LLMGW_RANK", "0")))
    parser.add_argument("--shards", type=int, default=int(env("LLMGW_SHARDS", "1")))
    parser.add_argument("--leader", default=env("LLMGW_LEADER"), help="rank 0's rendezvous address:port")
    parser.add_argument("--bind", default=env("LLMGW_BIND_ADDRESS", "127.0.0.1"),
                        help="this node's fabric address (rank 0 binds the rendezvous there)")
    parser.add_argument("--host", default="0.0.0.0", help="rank 0: HTTP address")
    parser.add_argument("--port", type=int, default=int(env("LLMGW_PORT", "8080")), help="rank 0: HTTP port")
    parser.add_argument("--join-timeout", type=float, default=600.0)
    args = parser.parse_args(argv)
    if args.shards > 1 and not args.leader:
        parser.error("--leader address:port is required for a replica of more than one shard")
    if not 0 <= args.rank < args.shards:
        parser.error("--rank must be in 0..%d" % (args.shards - 1))
    return args


def split_address(text):
    host, port = text.rsplit(":", 1)
    return host, int(port)


def send(sock, message):
    sock.sendall((json.dumps(message) + "\n").encode())


class Peer:
    """One end of a rendezvous connection: JSON lines, pings both ways, death on silence."""

    def __init__(self, sock, name):
        self.sock = sock
        self.name = name
        self.reader = sock.makefile("r", encoding="utf-8")
        self.lock = threading.Lock()

    def send(self, message):
        with self.lock:
            send(self.sock, message)

    def receive(self):
        line = self.reader.readline()
        if not line:
            raise EOFError("%s closed the connection" % self.name)
        return json.loads(line)

    def keep_alive(self):
        """Ping every PING_EVERY s; returns the reason when the peer closes or is silent for PEER_TIMEOUT s."""
        gone = threading.Event()

        def pinger():
            while not gone.is_set():
                try:
                    self.send({"ping": time.time()})
                except OSError:
                    return
                time.sleep(PING_EVERY)

        threading.Thread(target=pinger, daemon=True).start()
        self.sock.settimeout(PEER_TIMEOUT)
        try:
            while True:
                self.receive()
        except (OSError, EOFError, ValueError) as exc:
            gone.set()
            self.reader.close()
            self.sock.close()
            return "%s is gone: %s" % (self.name, exc or "no ping for %.0f s" % PEER_TIMEOUT)


def join(args):
    """Connect to rank 0 and join; retries until --join-timeout. Returns the joined peer."""
    host, port = split_address(args.leader)
    deadline = time.monotonic() + args.join_timeout
    while True:
        try:
            sock = socket.create_connection((host, port), timeout=5, source_address=(args.bind, 0))
            peer = Peer(sock, "rank 0 (%s)" % args.leader)
            peer.send({"join": args.replica, "rank": args.rank, "shards": args.shards, "model": args.model})
            answer = peer.receive()
            if answer.get("ok"):
                return peer
            die("rank 0 refused the join: %s" % answer.get("error"))
        except (OSError, EOFError, ValueError) as exc:
            if time.monotonic() > deadline:
                die("rank 0 at %s never answered: %s" % (args.leader, exc))
            time.sleep(0.5)


def run_worker(args):
    while True:
        peer = join(args)
        log("rank %d of %d joined %s at %s; serving nothing" % (args.rank, args.shards, args.replica, args.leader))
        log(peer.keep_alive() + "; waiting to join again")


class Rendezvous:
    def __init__(self, args):
        self.args = args
        self.joined = {}
        self.all_joined = threading.Event()
        self.lock = threading.Lock()
        if args.shards == 1:
            self.all_joined.set()

    def serve(self):
        host, port = split_address(self.args.leader) if self.args.leader else (self.args.bind, 0)
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, port))
        listener.listen(16)
        log("rank 0 of %s waits at %s:%d for %d worker(s)" % (self.args.replica, host, port, self.args.shards - 1))
        while True:
            conn, remote = listener.accept()
            threading.Thread(target=self.welcome, args=(conn, remote), daemon=True).start()

    def welcome(self, conn, remote):
        conn.settimeout(PEER_TIMEOUT)
        peer = Peer(conn, "a worker at %s" % remote[0])
        try:
            hello = peer.receive()
        except (OSError, EOFError, ValueError):
            conn.close()
            return
        rank = hello.get("rank")
        error = None
        if hello.get("join") != self.args.replica or hello.get("shards") != self.args.shards:
            error = "this is %s with %d shards, not %s with %s" % (
                self.args.replica, self.args.shards, hello.get("join"), hello.get("shards"))
        elif not isinstance(rank, int) or not 0 < rank < self.args.shards:
            error = "rank %r is not a worker rank of %d shards" % (rank, self.args.shards)
        with self.lock:
            if error is None and rank in self.joined:
                error = "rank %d has joined already" % rank
            if error is None:
                self.joined[rank] = remote[0]
        if error is not None:
            peer.send({"ok": False, "error": error})
            log("refused a join from %s: %s" % (remote[0], error))
            conn.close()
            return
        peer.send({"ok": True})
        peer.name = "rank %d (%s)" % (rank, remote[0])
        log("rank %d joined from %s (%d of %d workers)" % (rank, remote[0], len(self.joined), self.args.shards - 1))
        if len(self.joined) == self.args.shards - 1:
            self.all_joined.set()
        die(peer.keep_alive())


def handler_for(args, rendezvous):
    class Handler(BaseHTTPRequestHandler):
        server_version = "llmgw-sim/1"

        def log_message(self, fmt, *values):
            log("http %s" % (fmt % values))

        def answer(self, status, body):
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path == "/health":
                self.answer(200, {"status": "ok", "replica": args.replica, "shards": args.shards,
                                  "joined": sorted(rendezvous.joined)})
            elif self.path == "/v1/models":
                self.answer(200, {"object": "list", "data": [{"id": args.model, "object": "model"}]})
            else:
                self.answer(404, {"error": "not found"})

        def do_POST(self):
            if self.path not in ("/v1/completions", "/completion"):
                self.answer(404, {"error": "not found"})
                return
            try:
                length = int(self.headers.get("Content-Length") or 0)
                request = json.loads(self.rfile.read(length) or b"{}")
            except ValueError:
                self.answer(400, {"error": "the body is not JSON"})
                return
            prompt = str(request.get("prompt", ""))
            tokens = max(1, int(request.get("max_tokens") or request.get("n_predict") or 8))
            text = "sim %s rank0+%d: %s" % (args.replica, args.shards - 1, " ".join(["tok"] * tokens))
            self.answer(200, {
                "id": "cmpl-sim-%d" % int(time.time() * 1000), "object": "text_completion",
                "model": args.model, "created": int(time.time()),
                "choices": [{"index": 0, "text": text, "finish_reason": "length"}],
                "usage": {"prompt_tokens": len(prompt.split()), "completion_tokens": tokens,
                          "total_tokens": len(prompt.split()) + tokens},
                "shards": args.shards, "prompt": prompt,
            })

    return Handler


def run_leader(args):
    rendezvous = Rendezvous(args)
    if args.shards > 1:
        threading.Thread(target=rendezvous.serve, daemon=True).start()
    while not rendezvous.all_joined.wait(timeout=30):
        log("still waiting: %d of %d workers joined" % (len(rendezvous.joined), args.shards - 1))
    server = ThreadingHTTPServer((args.host, args.port), handler_for(args, rendezvous))
    log("every shard joined; %s serves %s on %s:%d" % (args.replica, args.model, args.host, args.port))
    server.serve_forever()


def main(argv=None):
    args = parse_args(argv)
    if args.rank == 0:
        run_leader(args)
    else:
        run_worker(args)


if __name__ == "__main__":
    main()
