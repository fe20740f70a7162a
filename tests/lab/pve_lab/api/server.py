"""The HTTPS server: `/api2/json` as pve-proxy answers it, plus the lab's loopback-only `/lab/*` endpoints.

Run by `python -m pve_lab up` as a daemon (`python -m pve_lab.api.server --lab-dir .lab`); `--no-nodes` starts it
with VMs that have no guest (see pve_lab.api.backend).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import signal
import socket
import ssl
import struct
import sys
import threading
import time
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Dict, List, Optional, Tuple
from urllib.parse import parse_qsl, unquote, urlsplit

from pve_lab.api import (
    agent_handlers,
    backend,
    cluster_handlers,
    config_handlers,
    disk_handlers,
    lab_endpoints,
    power_handlers,
    task_handlers,
    vm_handlers,
)
from pve_lab.api.app import App
from pve_lab.api.constants import API_HOST, API_PORT, DEFAULT_LAB_DIR, LabPaths
from pve_lab.api.errors import ApiError
from pve_lab.api.router import Request, Router

LOG = logging.getLogger("pve_lab.api")
API_RE = re.compile(r"^/api2/([a-z]+)(/.*)?$")
MAX_BODY = 1024 * 1024
ROUTER = Router(cluster_handlers.ROUTES + task_handlers.ROUTES + vm_handlers.ROUTES + config_handlers.ROUTES
                + power_handlers.ROUTES + agent_handlers.ROUTES + disk_handlers.ROUTES)


def parse_params(query: str, body: bytes, content_type: str) -> Dict[str, object]:
    """Body then query string (the query wins), repeated keys as lists, JSON bodies as PVE 7+ accepts them."""
    params: Dict[str, object] = {}
    if body:
        if content_type.split(";")[0].strip().lower() == "application/json":
            data = json.loads(body.decode("utf-8"))
            if not isinstance(data, dict):
                raise ApiError(400, "JSON body must be an object")
            for key, value in data.items():
                params[key] = _from_json(value)
        else:
            _add_pairs(params, parse_qsl(body.decode("utf-8"), keep_blank_values=True))
    query_params: Dict[str, object] = {}
    _add_pairs(query_params, parse_qsl(query, keep_blank_values=True))
    params.update(query_params)
    params.pop("_dc", None)
    return params


def _add_pairs(params: Dict[str, object], pairs: List[Tuple[str, str]]) -> None:
    for key, value in pairs:
        if key in params:
            old = params[key]
            params[key] = (old if isinstance(old, list) else [old]) + [value]
        else:
            params[key] = value


def _from_json(value: object) -> object:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, list):
        return [str(_from_json(v)) for v in value]
    return str(value)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "pve-api-daemon/3.0"
    sys_version = ""
    timeout = 120

    @property
    def app(self) -> App:
        return self.server.app  # type: ignore[attr-defined]

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    def log_message(self, fmt: str, *args) -> None:
        LOG.info("%s %s", self.client_address[0], fmt % args)

    def _body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            raise ApiError(413, "request too large")
        return self.rfile.read(length) if length else b""

    def _send(self, status: int, reason: str, payload: Optional[Dict[str, object]], close: bool = False) -> None:
        body = json.dumps(payload).encode() if payload is not None else b""
        reason = reason.encode("latin-1", "replace").decode("latin-1")
        self.send_response(status, reason)
        if payload is not None:
            self.send_header("Content-Type", "application/json;charset=UTF-8")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "max-age=0")
        self.send_header("Pragma", "no-cache")
        if close or status >= 300:  # pve-proxy does not keep a connection alive after an error
            self.send_header("Connection", "close")
            self.close_connection = True
        try:
            self.end_headers()
            self.wfile.write(body)
        except (ConnectionError, ssl.SSLError) as err:
            raise ClientGone(str(err))

    def _handle(self, method: str) -> None:
        url = urlsplit(self.path)
        path = unquote(url.path)
        try:
            body = self._body()
        except ApiError as err:
            self._send(err.status, err.reason, {"data": None, "message": err.message + "\n"}, close=True)
            return
        if path.startswith("/lab/"):
            if self.client_address[0] not in ("127.0.0.1", "::1"):
                self._send(403, "Forbidden", {"message": "the lab endpoints answer on loopback only"})
                return
            status, payload = lab_endpoints.handle(self.app, method, path, body)
            self._send(status, str(payload.get("message", "OK")), payload)
            return
        match = API_RE.match(path)
        if not match:
            self._send(501, "no such file '%s'" % path, None)
            return
        if match.group(1) != "json":
            self._send(501, "no such uri", None)
            return
        rel = "/" + "/".join(part for part in (match.group(2) or "/").split("/") if part)
        try:
            self._api(method, rel, url.query, body)
        except ApiError as err:
            if err.status == 401 and self.app.unauthorized_delay:
                time.sleep(self.app.unauthorized_delay)
            payload = None
            if err.body:
                payload = {"data": None, "message": err.message if err.message.endswith("\n") else err.message + "\n"}
                if err.errors:
                    payload["errors"] = err.errors
            self._send(err.status, err.reason, payload)
        except ConnectionReset as err:
            LOG.info("%s: connection reset (reset_requests fault), not handled", err)
            self.close_connection = True
            # SO_LINGER 0: close() sends a TCP RST, as a middlebox or a crashed pveproxy worker would
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()
        except ClientGone as err:
            # The client left before its answer was written (it timed out): the request was handled all the same,
            # and there is nobody to send a 500 to. Logged once, as handled, not a second time as a failure.
            LOG.info("%s %s: the client left before its answer was sent: %s", method, rel, err)
            self.close_connection = True
        except Exception as err:  # an unexpected failure is a 500 with its text, as an uncaught `die` would be
            LOG.error("%s %s failed: %s", method, rel, traceback.format_exc())
            self._send(500, str(err).splitlines()[0] if str(err) else "internal error",
                       {"data": None, "message": "%s\n" % err})

    def _api(self, method: str, rel: str, query: str, body: bytes) -> None:
        headers = {k.lower(): v for k, v in self.headers.items()}
        user = self.app.auth.authenticate(method, rel, headers)
        if self.app.faults.take_request_reset(method, rel):
            raise ConnectionReset("%s %s" % (method, rel))
        injected = self.app.faults.take_request_failure(rel)
        if injected is not None:
            raise ApiError(injected[0], injected[1])
        delay = self.app.faults.take_request_delay(method, rel)
        if delay:
            time.sleep(delay)
        try:
            params = parse_params(query, body, headers.get("content-type", ""))
        except (ValueError, UnicodeDecodeError) as err:
            raise ApiError(400, "unable to parse request parameters: %s" % err)
        data = ROUTER.dispatch(self.app, Request(method, rel, params, user))  # type: ignore[arg-type]
        payload: Dict[str, object] = {"data": data}
        if hasattr(data, "total"):
            payload["total"] = data.total  # type: ignore[attr-defined]
        self._send(200, "OK", payload)


class ClientGone(ConnectionError):
    """The client closed its connection before its answer was written."""


class ConnectionReset(Exception):
    """The `reset_requests` fault: the connection is to be reset, the request neither handled nor answered."""


class LabServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address, app: App, context: ssl.SSLContext):
        super().__init__(address, Handler)
        self.app = app
        # the TLS handshake happens in the request's own thread, so one slow client cannot hold up the others
        self.socket = context.wrap_socket(self.socket, server_side=True, do_handshake_on_connect=False)

    def handle_error(self, request, client_address) -> None:
        err = sys.exc_info()[1]
        if isinstance(err, (ssl.SSLError, ConnectionError, TimeoutError)):
            LOG.info("connection from %s ended: %s", client_address[0], err)
            return
        LOG.error("request from %s failed: %s", client_address[0], traceback.format_exc())


def tls_context(paths: LabPaths) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(paths.server_cert, paths.server_key)
    return context


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--lab-dir", default=DEFAULT_LAB_DIR)
    parser.add_argument("--host", default=API_HOST)
    parser.add_argument("--port", type=int, default=API_PORT)
    parser.add_argument("--no-nodes", action="store_true", help="VMs without a guest: start/stop only flip status")
    parser.add_argument("--unauthorized-delay", type=float, default=0.1,
                        help="seconds every 401 waits (real PVE: 3)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    paths = LabPaths(os.path.abspath(args.lab_dir))
    node_backend, kind = backend.load(args.no_nodes, paths.lab_dir)
    app = App(paths, node_backend, kind, args.unauthorized_delay)
    httpd = LabServer((args.host, args.port), app, tls_context(paths))
    os.makedirs(paths.api_dir, exist_ok=True)
    with open(paths.pid_file, "w") as handle:
        handle.write("%d\n" % os.getpid())

    def stop(signum, frame) -> None:
        threading.Thread(target=httpd.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    LOG.info("Proxmox VE API on https://%s:%d/api2/json (backend: %s)", args.host, args.port, kind)
    try:
        httpd.serve_forever()
    finally:
        httpd.server_close()
        try:
            with open(paths.pid_file) as handle:
                if handle.read().strip() == str(os.getpid()):
                    os.unlink(paths.pid_file)
        except OSError:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
