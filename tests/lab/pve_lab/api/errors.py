"""The error shapes of the PVE API: the message travels in the HTTP reason phrase, the body is `{"data": null}`."""

from __future__ import annotations

from typing import Dict, Optional

PARAM_FAILED = "Parameter verification failed."


class ApiError(Exception):
    """An answer other than 200. `message` is the text PVE would `die` with (first line goes to the reason)."""

    def __init__(self, status: int, message: str, errors: Optional[Dict[str, str]] = None, body: bool = True):
        super().__init__(message)
        self.status = status
        self.message = message
        self.errors = errors
        self.body = body  # PVE's auth failures answer with an empty body

    @property
    def reason(self) -> str:
        return (self.message.strip().splitlines() or [""])[0]


def param_error(errors: Dict[str, str]) -> ApiError:
    """raise_param_exc: 400 "Parameter verification failed." with the per-parameter messages."""
    return ApiError(400, PARAM_FAILED, errors=errors)


def fail(message: str) -> ApiError:
    """A plain `die` inside an API handler: HTTP 500 with the message."""
    return ApiError(500, message)


def unauthorized(message: str) -> ApiError:
    return ApiError(401, message, body=False)


def config_missing(node: str, vmid: int) -> ApiError:
    return fail("Configuration file 'nodes/%s/qemu-server/%d.conf' does not exist" % (node, vmid))


class TaskError(Exception):
    """A worker task ended in an error; the message becomes the task's exit status."""
