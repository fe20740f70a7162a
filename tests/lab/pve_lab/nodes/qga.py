"""A client of the QEMU guest agent protocol (QMP-style JSON over a stream socket), as PVE's agent endpoints use.

Every exchange starts with guest-sync-delimited, the protocol's way to drop whatever a previous client left
half-read in the channel: the reply carries our random id after a 0xFF byte.
"""

from __future__ import annotations

import json
import random
import socket
import time
from typing import Any, Dict, Optional


class AgentNotRunning(RuntimeError):
    """No agent answered (no socket, or nothing replied in time): PVE says 'QEMU guest agent is not running'."""


class AgentError(RuntimeError):
    """The agent answered with an error; ``klass`` is QGA's error class (e.g. GenericError)."""

    def __init__(self, klass: str, desc: str):
        super().__init__(desc)
        self.klass = klass
        self.desc = desc


class _Channel:
    def __init__(self, path: str, timeout: float):
        self.deadline = time.monotonic() + timeout
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.buf = b""
        try:
            self.sock.settimeout(timeout)
            self.sock.connect(path)
        except OSError as exc:
            self.sock.close()
            raise AgentNotRunning("QEMU guest agent is not running (%s)" % exc)

    def close(self) -> None:
        self.sock.close()

    def send(self, payload: bytes) -> None:
        try:
            self.sock.sendall(payload)
        except OSError as exc:
            raise AgentNotRunning("QEMU guest agent is not running (%s)" % exc)

    def _fill(self) -> None:
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise AgentNotRunning("QEMU guest agent is not running (no reply in time)")
        self.sock.settimeout(remaining)
        try:
            chunk = self.sock.recv(65536)
        except socket.timeout:
            raise AgentNotRunning("QEMU guest agent is not running (no reply in time)")
        except OSError as exc:
            raise AgentNotRunning("QEMU guest agent is not running (%s)" % exc)
        if not chunk:
            raise AgentNotRunning("QEMU guest agent is not running (channel closed)")
        self.buf += chunk

    def skip_to_delimiter(self) -> None:
        while b"\xff" not in self.buf:
            self.buf = b""
            self._fill()
        self.buf = self.buf.split(b"\xff", 1)[1]

    def read_message(self) -> Dict[str, Any]:
        while True:
            while b"\n" not in self.buf:
                self._fill()
            line, self.buf = self.buf.split(b"\n", 1)
            line = line.strip().lstrip(b"\xff")
            if line:
                try:
                    return json.loads(line)
                except ValueError:
                    continue


def command(socket_path: str, execute: str, arguments: Optional[Dict[str, Any]] = None,
            timeout: float = 10.0, sync_timeout: float = 5.0) -> Any:
    """Run one QGA command and return its ``return`` value."""
    chan = _Channel(socket_path, sync_timeout)
    try:
        sync_id = random.randint(1, 2**31 - 1)
        chan.send(b"\xff" + json.dumps({"execute": "guest-sync-delimited",
                                        "arguments": {"id": sync_id}}).encode() + b"\n")
        while True:
            chan.skip_to_delimiter()
            reply = chan.read_message()
            if reply.get("return") == sync_id:
                break
        chan.deadline = time.monotonic() + timeout
        request: Dict[str, Any] = {"execute": execute}
        if arguments:
            request["arguments"] = arguments
        chan.send(json.dumps(request).encode() + b"\n")
        reply = chan.read_message()
    finally:
        chan.close()
    if "error" in reply:
        err = reply["error"]
        raise AgentError(err.get("class", "GenericError"), err.get("desc", "unknown error"))
    return reply.get("return")
