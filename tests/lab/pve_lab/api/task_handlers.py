"""/nodes/{node}/tasks: list, status, log, stop (pve-manager PVE/API2/Tasks.pm)."""

from __future__ import annotations

from typing import Dict

from pve_lab.api.app import App
from pve_lab.api.router import Request, route
from pve_lab.api.schema import Prop, required

UPID = required(Prop())


def task_list(app: App, p: Dict[str, object], req: Request) -> object:
    """Finished tasks by default (`source=archive`), newest first."""
    source = p.get("source", "archive")
    result = []
    for task in app.tasks.all():
        if source == "archive" and task.status == "running" or source == "active" and task.status != "running":
            continue
        if p.get("vmid") is not None and task.id != str(p["vmid"]):
            continue
        if p.get("typefilter") and task.type != p["typefilter"]:
            continue
        if p.get("userfilter") and p["userfilter"] not in task.user:
            continue
        if p.get("errors") and task.exitstatus in (None, "OK"):
            continue
        result.append(task.list_view())
    start = int(p.get("start", 0))
    return result[start:start + int(p.get("limit", 50))]


def task_index(app: App, p: Dict[str, object], req: Request) -> object:
    app.tasks.get(str(p["upid"]))
    return [{"name": "log"}, {"name": "status"}]


def task_status(app: App, p: Dict[str, object], req: Request) -> object:
    return app.tasks.get(str(p["upid"])).status_view()


class _LogPage(list):
    """A page of the task log; PVE puts the line count next to `data` as `total`."""

    total = 0


def task_log(app: App, p: Dict[str, object], req: Request) -> object:
    task = app.tasks.get(str(p["upid"]))
    lines = list(task.log)
    start, limit = int(p.get("start", 0)), int(p.get("limit", 50))
    page = _LogPage({"n": n + 1, "t": line} for n, line in enumerate(lines) if start <= n < start + limit)
    page.total = len(lines)
    return page


def task_stop(app: App, p: Dict[str, object], req: Request) -> object:
    app.tasks.stop(str(p["upid"]))
    return None


ROUTES = [
    route("GET", "/nodes/{node}/tasks", task_list, {
        "start": Prop(type="integer", minimum=0), "limit": Prop(type="integer", minimum=0),
        "vmid": Prop(type="integer", minimum=100), "typefilter": Prop(), "userfilter": Prop(),
        "errors": Prop(type="boolean"), "source": Prop(enum=["archive", "active", "all"]),
        "since": Prop(type="integer"), "until": Prop(type="integer"), "statusfilter": Prop()}),
    route("GET", "/nodes/{node}/tasks/{upid}", task_index, {"upid": UPID}),
    route("DELETE", "/nodes/{node}/tasks/{upid}", task_stop, {"upid": UPID}),
    route("GET", "/nodes/{node}/tasks/{upid}/status", task_status, {"upid": UPID}),
    route("GET", "/nodes/{node}/tasks/{upid}/log", task_log, {
        "upid": UPID, "start": Prop(type="integer", minimum=0), "limit": Prop(type="integer", minimum=0),
        "download": Prop(type="boolean")}),
]
