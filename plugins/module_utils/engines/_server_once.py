# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Start llama-server on loopback, ask it for one completion, stop it: one attempt of the completion probe.

The I/O side of ``completion_probe`` (which says what the attempts mean). A long-running child with a client
talking to it meanwhile is not what ``AnsibleModule.run_command`` does: the server is started with
:func:`runtime.start_binary`, the engine modules' one way to run a binary.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import tempfile
import time

from ansible.module_utils.urls import open_url

from ansible_collections.llmgw.fleet.plugins.module_utils import ggml_cpu_variants
from ansible_collections.llmgw.fleet.plugins.module_utils.engines import runtime


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def answer(port, timeout):
    """(True, "") when the server is healthy and answers a completion; (False, what was seen) otherwise."""
    base = "http://127.0.0.1:%d" % port
    try:
        with open_url(base + "/health", timeout=5) as response:
            if response.status != 200:
                return False, "health answered %d" % response.status
    except Exception as exc:  # not up yet: refused, 503 while loading
        return False, "health: %s" % exc
    body = json.dumps({"prompt": "hello", "n_predict": 4}).encode()
    try:
        with open_url(base + "/completion", data=body, method="POST", timeout=timeout,
                      headers={"Content-Type": "application/json"}) as response:
            done = json.load(response)
    except Exception as exc:
        return None, "completion: %s" % exc
    if done.get("tokens_predicted", 0) < 1:
        return None, "completion predicted no token: %s" % json.dumps(done)[:300]
    return True, ""


def attempt(engine_dir, model, threads, timeout, args):
    port = free_port()
    argv = [os.path.join(engine_dir, "llama-server"), "--verbose", "--host", "127.0.0.1", "--port", str(port),
            "--model", model, "--ctx-size", "256", "--threads", str(threads)] + list(args)
    with tempfile.TemporaryFile(mode="w+", errors="replace") as log:
        server = runtime.start_binary(argv, log)
        result = {"args": list(args), "answered": False, "rc": None, "error": ""}
        try:
            deadline = time.monotonic() + timeout
            while True:
                ok, seen = answer(port, timeout)
                if ok:
                    result["answered"] = True
                    break
                rc = server.poll()
                if ok is None or rc is not None:  # the completion failed, or the server is gone
                    try:  # a crash during the request: give the exit status a moment to arrive
                        result["rc"] = server.wait(timeout=5)
                    except subprocess.TimeoutExpired:
                        pass  # still running: the failure was on the HTTP side
                    result["error"] = seen
                    break
                if time.monotonic() > deadline:
                    result["error"] = "no answer within %d s (last: %s)" % (timeout, seen)
                    break
                time.sleep(0.3)
        finally:
            if server.poll() is None:
                server.terminate()
                try:
                    server.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    server.kill()
                    server.wait()
            log.seek(0)
            text = log.read()
    result["variant"] = ggml_cpu_variants.loaded_variant(text)[0]
    result["log_tail"] = "" if result["answered"] else " | ".join(text.strip().splitlines()[-6:])
    return result
