"""Faults the tests switch on through the lab endpoint `/lab/faults` (loopback only, outside /api2).

- a task that ends in an error: the next task (optionally of one type / for one VM: the VM the task acts on, for
  a clone the new one) fails with the given text before doing anything, with the prefix PVE would add for that
  task type;
- 5xx answers: the next N requests to /api2 (optionally only those whose path starts with a prefix, such as
  `/nodes/pve/qemu/123`) answer with the given status and message;
- slow answers: the next N requests to /api2 (optionally of one method, and only those whose path starts with a
  prefix) wait the given seconds before they are handled, and are then handled all the same: a client that gave
  up meanwhile does not know whether a write was done, as with a PVE that answers slower than its timeout;
- slow tasks: every task waits N seconds (holding its locks) before it works;
- a VM lock: handled by the server, which sets the `lock` key of the VM's config as `qm set --lock` would.
"""

from __future__ import annotations

import threading
from typing import Dict, List, Optional, Tuple

from pve_lab.api.schema import INTEGER_RE


class FaultError(ValueError):
    """A /lab/faults request the lab does not understand."""


class Faults:
    def __init__(self):
        self._lock = threading.Lock()
        self.clear()

    def clear(self) -> None:
        self.task_failures: List[Dict[str, object]] = []
        self.request_failures = 0
        self.request_status = 500
        self.request_message = "injected fault"
        self.request_path = ""
        self.task_delay = 0.0
        self.slow_requests = 0
        self.slow_delay = 0.0
        self.slow_method = ""
        self.slow_path = ""
        self.reset_requests = 0
        self.reset_method = ""
        self.reset_path = ""
        self.ticket_lifetime: Optional[float] = None  # seconds a ticket stays valid; None: PVE's two hours

    def snapshot(self) -> Dict[str, object]:
        with self._lock:
            return {"task_failures": list(self.task_failures), "request_failures": self.request_failures,
                    "request_status": self.request_status, "request_message": self.request_message,
                    "request_path": self.request_path, "task_delay": self.task_delay,
                    "slow_requests": self.slow_requests, "slow_delay": self.slow_delay,
                    "slow_method": self.slow_method, "slow_path": self.slow_path,
                    "reset_requests": self.reset_requests, "reset_method": self.reset_method,
                    "reset_path": self.reset_path, "ticket_lifetime": self.ticket_lifetime}

    def update(self, payload: Dict[str, object]) -> None:
        with self._lock:
            if "fail_next_task" in payload:
                self.task_failures.append(_task_failure(payload["fail_next_task"]))
            if "fail_requests" in payload:
                self.request_failures = _non_negative_int(payload["fail_requests"], "fail_requests")
                self.request_status = _non_negative_int(payload.get("status", 500), "status")
                if not 500 <= self.request_status <= 599:
                    raise FaultError("status must be a 5xx code")
                self.request_message = str(payload.get("message", "injected fault"))
                self.request_path = str(payload.get("path", ""))
            if "slow_requests" in payload:
                self.slow_requests = _non_negative_int(payload["slow_requests"], "slow_requests")
                self.slow_delay = _seconds(payload.get("delay", 0), "delay")
                self.slow_method = str(payload.get("method", "")).upper()
                self.slow_path = str(payload.get("path", ""))
            if "reset_requests" in payload:
                self.reset_requests = _non_negative_int(payload["reset_requests"], "reset_requests")
                self.reset_method = str(payload.get("method", "")).upper()
                self.reset_path = str(payload.get("path", ""))
            if "ticket_lifetime" in payload:
                self.ticket_lifetime = _seconds(payload["ticket_lifetime"], "ticket_lifetime") or None
            if "task_delay" in payload:
                try:
                    self.task_delay = max(0.0, float(payload["task_delay"]))  # type: ignore[arg-type]
                except (TypeError, ValueError):
                    raise FaultError("task_delay must be a number of seconds")

    def take_task_failure(self, task_type: str, vmid: Optional[int]) -> Optional[str]:
        with self._lock:
            for index, failure in enumerate(self.task_failures):
                if failure.get("type") not in (None, task_type):
                    continue
                if failure.get("vmid") not in (None, vmid):
                    continue
                del self.task_failures[index]
                return str(failure["message"])
        return None

    def remove(self, payload: Dict[str, object]) -> None:
        """Switches off only what `payload` names (what one test set), leaving other clients' faults alone."""
        with self._lock:
            if "fail_next_task" in payload:
                message = payload["fail_next_task"]
                self.task_failures = [f for f in self.task_failures if f["message"] != message]
            if payload.get("fail_requests"):
                self.request_failures = 0
            if payload.get("task_delay"):
                self.task_delay = 0.0
            if payload.get("slow_requests"):
                self.slow_requests = 0
            if payload.get("ticket_lifetime"):
                self.ticket_lifetime = None
            if payload.get("reset_requests"):
                self.reset_requests = 0

    def take_request_failure(self, path: str) -> Optional[Tuple[int, str]]:
        with self._lock:
            if self.request_failures <= 0 or not path.startswith(self.request_path):
                return None
            self.request_failures -= 1
            return self.request_status, self.request_message

    def take_request_reset(self, method: str, path: str) -> bool:
        """Whether to drop this request's connection unanswered (and unhandled); counts it against
        ``reset_requests``."""
        with self._lock:
            if self.reset_requests <= 0 or not path.startswith(self.reset_path):
                return False
            if self.reset_method and method.upper() != self.reset_method:
                return False
            self.reset_requests -= 1
            return True

    def take_request_delay(self, method: str, path: str) -> float:
        """Seconds to wait before handling this request (0 for none); counts it against ``slow_requests``."""
        with self._lock:
            if self.slow_requests <= 0 or not path.startswith(self.slow_path):
                return 0.0
            if self.slow_method and method.upper() != self.slow_method:
                return 0.0
            self.slow_requests -= 1
            return self.slow_delay


def _seconds(value: object, name: str) -> float:
    try:
        seconds = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise FaultError("%s must be a number of seconds" % name)
    if not 0 <= seconds <= 600:
        raise FaultError("%s must be between 0 and 600 seconds" % name)
    return seconds


def _task_failure(value: object) -> Dict[str, object]:
    if isinstance(value, str):
        return {"message": value, "type": None, "vmid": None}
    if isinstance(value, dict) and isinstance(value.get("message"), str):
        vmid = value.get("vmid")
        return {"message": value["message"], "type": value.get("type"),
                "vmid": None if vmid is None else _non_negative_int(vmid, "vmid")}
    raise FaultError("fail_next_task is a message or {message, type?, vmid?}")


def _non_negative_int(value: object, name: str) -> int:
    if isinstance(value, bool) or not INTEGER_RE.match(str(value)) or int(str(value)) < 0:
        raise FaultError("%s must be a non-negative integer" % name)
    return int(str(value))
