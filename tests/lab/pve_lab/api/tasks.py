"""Worker tasks as PVE runs them: a UPID, a log, `running` then `stopped` with `OK`, `WARNINGS: N` or the error.

UPID format (pve-common PVE/UPID.pm): `UPID:node:PID:PSTART:STARTTIME:type:id:user:` with a trailing colon.
Tasks are kept in `.lab/api/tasks.json`; one that was running when the server stopped reads back as stopped with
`unexpected status`, as PVE reports a worker that vanished.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Dict, List, Optional

from pve_lab.api.errors import ApiError, TaskError, fail
from pve_lab.api.faults import Faults

UPID_RE = re.compile(r"^UPID:([a-zA-Z0-9]([a-zA-Z0-9\-]*[a-zA-Z0-9])?):([0-9A-F]{8}):([0-9A-F]{8,9}):"
                     r"([0-9A-F]{8}):([^:\s]+):([^:\s]*):([^:\s]+):$")
KEEP_TASKS = 2000


@dataclass
class Task:
    upid: str
    node: str
    pid: int
    pstart: int
    starttime: int
    type: str
    id: str
    user: str
    status: str = "running"
    exitstatus: Optional[str] = None
    endtime: Optional[int] = None
    log: List[str] = field(default_factory=list)

    def status_view(self) -> Dict[str, object]:
        """GET /nodes/{node}/tasks/{upid}/status."""
        user, _ignored, token = self.user.partition("!")
        view: Dict[str, object] = {"upid": self.upid, "node": self.node, "pid": self.pid, "pstart": self.pstart,
                                   "starttime": self.starttime, "type": self.type, "id": self.id, "user": user,
                                   "status": self.status}
        if token:
            view["tokenid"] = token
        if self.status == "stopped":
            view["exitstatus"] = self.exitstatus
        return view

    def list_view(self) -> Dict[str, object]:
        """An entry of GET /nodes/{node}/tasks."""
        view = {k: v for k, v in self.status_view().items() if k not in ("status", "exitstatus")}
        if self.status == "stopped":
            view["status"] = self.exitstatus
            view["endtime"] = self.endtime
        return view


class TaskContext:
    """What a worker may do: write to its log, warn (counted into `WARNINGS: N`), see whether it was stopped."""

    def __init__(self, task: Task, registry: TaskRegistry):
        self.task = task
        self._registry = registry
        self.warnings = 0
        self.cancelled = threading.Event()
        self.vmid: Optional[int] = None

    def log(self, line: str) -> None:
        self._registry.append_log(self.task, line)

    def warn(self, line: str) -> None:
        self.warnings += 1
        self.log("WARN: " + line)

    def fault_point(self) -> None:
        """Where the task's faults strike: the task delay, then an injected failure. Before the work, unless the
        worker places this itself (`spawn(..., faults_inside=True)`): a clone's faults strike during its disk copy,
        with its locks held and its temporary config written."""
        faults = self._registry.faults
        if faults.task_delay and self.cancelled.wait(faults.task_delay):
            raise TaskError("interrupted by signal")
        injected = faults.take_task_failure(self.task.type, self.vmid)
        if injected is not None:
            raise TaskError(injected)


Work = Callable[[TaskContext], None]
OnError = Callable[[str], str]


class TaskRegistry:
    def __init__(self, node: str, path: str, faults: Faults):
        self.node = node
        self.path = path
        self.faults = faults
        self._lock = threading.RLock()
        self._tasks: Dict[str, Task] = {}
        self._contexts: Dict[str, TaskContext] = {}
        self._seq = 0
        if os.path.exists(path):
            with open(path) as handle:
                data = json.load(handle)
            self._seq = data["seq"]
            for item in data["tasks"]:
                task = Task(**item)
                if task.status == "running":
                    task.status, task.exitstatus, task.endtime = "stopped", "unexpected status", int(time.time())
                self._tasks[task.upid] = task

    def _save(self) -> None:
        with self._lock:
            tasks = sorted(self._tasks.values(), key=lambda t: (t.starttime, t.pid))[-KEEP_TASKS:]
            self._tasks = {t.upid: t for t in tasks}
            data = {"seq": self._seq, "tasks": [asdict(t) for t in tasks]}
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            with open(self.path + ".tmp", "w") as handle:
                json.dump(data, handle)
            os.replace(self.path + ".tmp", self.path)

    def append_log(self, task: Task, line: str) -> None:
        with self._lock:
            task.log.extend(line.rstrip("\n").split("\n"))

    def spawn(self, task_type: str, task_id: str, user: str, work: Work, vmid: Optional[int] = None,
              on_error: Optional[OnError] = None, faults_inside: bool = False) -> str:
        """Start `work` as a task and return its UPID; `on_error` cleans up and gives the final error text."""
        with self._lock:
            self._seq += 1
            pid = 0x20000 + self._seq
            pstart = _clock_ticks_since_boot()
            starttime = int(time.time())
            upid = "UPID:%s:%08X:%08X:%08X:%s:%s:%s:" % (self.node, pid, pstart, starttime, task_type, task_id, user)
            task = Task(upid, self.node, pid, pstart, starttime, task_type, task_id, user)
            self._tasks[upid] = task
            ctx = TaskContext(task, self)
            ctx.vmid = vmid
            self._contexts[upid] = ctx
            self._save()
        thread = threading.Thread(target=self._run, args=(ctx, work, on_error, faults_inside), name="task-" + task_type,
                                  daemon=True)
        thread.start()
        return upid

    def _run(self, ctx: TaskContext, work: Work, on_error: Optional[OnError], faults_inside: bool) -> None:
        task = ctx.task
        try:
            if not faults_inside:
                ctx.fault_point()
            work(ctx)
        except Exception as err:  # every failure of a worker ends its task, as fork_worker does
            message = err.message if isinstance(err, ApiError) else str(err)
            message = message.strip() or type(err).__name__
            if on_error is not None:
                try:
                    message = on_error(message)
                except Exception as cleanup_err:  # a failed cleanup is logged, not raised
                    ctx.log("cleanup failed: %s" % cleanup_err)
            self._finish(task, message, "TASK ERROR: " + message)
            return
        if ctx.warnings:
            self._finish(task, "WARNINGS: %d" % ctx.warnings, "TASK WARNINGS: %d" % ctx.warnings)
        else:
            self._finish(task, "OK", "TASK OK")

    def _finish(self, task: Task, exitstatus: str, last_line: str) -> None:
        with self._lock:
            task.log.append(last_line)
            task.status, task.exitstatus, task.endtime = "stopped", exitstatus, int(time.time())
            self._contexts.pop(task.upid, None)
            self._save()

    def get(self, upid: str) -> Task:
        if not UPID_RE.match(upid):
            raise fail("unable to parse worker upid '%s'" % upid)
        with self._lock:
            task = self._tasks.get(upid)
        if task is None:
            raise fail("no such task")
        return task

    def stop(self, upid: str) -> None:
        self.get(upid)
        with self._lock:
            ctx = self._contexts.get(upid)
        if ctx is not None:
            ctx.cancelled.set()

    def all(self) -> List[Task]:
        with self._lock:
            return sorted(self._tasks.values(), key=lambda t: (t.starttime, t.pid), reverse=True)


def _clock_ticks_since_boot() -> int:
    try:
        with open("/proc/uptime") as handle:
            return int(float(handle.read().split()[0]) * 100)
    except OSError:
        return int(time.monotonic() * 100)
