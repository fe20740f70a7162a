# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Proxmox VE tasks, as the client waits for them itself: a task id (UPID) read by :func:`parse_upid`, an exit
status judged by :func:`task_succeeded` (``OK`` and ``WARNINGS: N`` are success), and :class:`TaskCalls`: a task
waited for (one that ends in an error fails at once, with the tail of its log) and its log's tail read.

Private to :mod:`proxmox_client` (which re-exports the public names); does I/O: the API calls of
:class:`proxmox_client.ProxmoxClient` (``parse_upid`` and ``task_succeeded`` are pure).
"""

from __future__ import annotations

from ansible_collections.llmgw.fleet.plugins.module_utils.proxmox_errors import ProxmoxError, TaskFailed, Timeout

TASK_LOG_TAIL = 20


def parse_upid(upid):
    """``UPID:node:pid:pstart:starttime:type:id:user:`` -> dict (node, type, id, user)."""
    parts = str(upid or "").split(":")
    if len(parts) < 8 or parts[0] != "UPID":
        raise ProxmoxError("not a task id (UPID): %r" % (upid,))
    return {"node": parts[1], "type": parts[5], "id": parts[6], "user": parts[7], "upid": upid}


def task_succeeded(exitstatus):
    """``OK`` and ``WARNINGS: N`` are success; anything else is the task's error text."""
    text = str(exitstatus or "")
    return text == "OK" or text.startswith("WARNINGS:")


class TaskCalls:
    """The task side of :class:`proxmox_client.ProxmoxClient`: ``get``, ``_clock``, ``_sleep`` and
    ``_poll_interval`` come from ProxmoxClient."""

    def _run_task(self, result, timeout):
        """Calls that may answer with a UPID (or null, when the server did the work synchronously)."""
        if isinstance(result, str) and result.startswith("UPID:"):
            return self.wait_task(result, timeout)
        return result

    def task_log_tail(self, upid, lines=TASK_LOG_TAIL):
        node = parse_upid(upid)["node"]
        try:
            entries = self.get("nodes/%s/tasks/%s/log" % (node, upid), start=0, limit=100000) or []
        except ProxmoxError:
            return []
        entries = sorted(entries, key=lambda e: int(e.get("n", 0)))
        return [str(e.get("t", "")) for e in entries[-lines:]]

    def wait_task(self, upid, timeout):
        """Wait for a task; return its exit status. TaskFailed at once on an error, Timeout past ``timeout``."""
        info = parse_upid(upid)
        path = "nodes/%s/tasks/%s/status" % (info["node"], upid)
        deadline = self._clock() + timeout
        delay = 0.1
        while True:
            status = self.get(path) or {}
            if status.get("status") == "stopped":
                exitstatus = status.get("exitstatus")
                if task_succeeded(exitstatus):
                    return exitstatus
                tail = self.task_log_tail(upid)
                raise TaskFailed(
                    "task %s %s on node %s failed: %s%s"
                    % (
                        info["type"],
                        info["id"],
                        info["node"],
                        exitstatus,
                        ("\n--- task log (last %d lines) ---\n%s" % (len(tail), "\n".join(tail))) if tail else "",
                    ),
                    upid=upid,
                    exitstatus=exitstatus,
                    log_tail=tail,
                )
            if self._clock() >= deadline:
                tail = self.task_log_tail(upid)
                raise Timeout(
                    "task %s %s on node %s still running after %ss (it was not stopped: %s)%s"
                    % (
                        info["type"],
                        info["id"],
                        info["node"],
                        timeout,
                        upid,
                        ("\n--- task log (last %d lines) ---\n%s" % (len(tail), "\n".join(tail))) if tail else "",
                    ),
                    what="task",
                    upid=upid,
                    log_tail=tail,
                )
            self._sleep(delay)
            delay = min(delay * 2, self._poll_interval)
