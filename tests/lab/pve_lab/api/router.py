"""Routes of /api2/json: path templates, their parameter schemas, and dispatch as PVE's RESTHandler does it.

Path variables are parameters like any other (a bad `vmid` in the path is a 400). A call for another node is
proxied by PVE; the lab has one node, so the proxy's hostname lookup fails as it would for an unknown name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence

from pve_lab.api import permissions
from pve_lab.api.errors import ApiError, fail, param_error
from pve_lab.api.schema import ParamValue, Prop, node_format, required, validate, vmid_format

NODE_PROP = required(Prop(format=node_format))
VMID_PROP = Prop(type="integer", format=vmid_format, minimum=100, maximum=999999999, optional=False)


@dataclass
class Request:
    method: str
    path: str
    params: Dict[str, ParamValue]
    user: Optional[str]


Handler = Callable[..., object]
ROOT = "root@pam"


def root_only(req: Request, params: Dict[str, object], names: Sequence[str]) -> None:
    """Options only root@pam itself may use; an API token, even root's own without privilege separation, may not."""
    if req.user == ROOT:
        return
    for name in names:
        if params.get(name):
            raise param_error({name: "Only root may use this option."})


def root_only_config(req: Request, params: Dict[str, object]) -> None:
    """check_vm_modify_config_perm: config keys no privilege covers are root@pam's alone."""
    if req.user == ROOT:
        return
    for name in ("lock", "args"):
        if name in params:
            raise fail("only root can set '%s' config" % name)


@dataclass(frozen=True)
class Route:
    method: str
    template: str
    handler: Handler
    props: Dict[str, Prop]
    additional: bool = False

    @property
    def regex(self):
        return re.compile("^" + re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", self.template) + "$")


def route(method: str, template: str, handler: Handler, props: Optional[Dict[str, Prop]] = None,
          additional: bool = False) -> Route:
    base: Dict[str, Prop] = {}
    if "{node}" in template:
        base["node"] = NODE_PROP
    if "{vmid}" in template:
        base["vmid"] = VMID_PROP
    return Route(method, template, handler, {**base, **(props or {})}, additional)


class Router:
    def __init__(self, routes: Sequence[Route]):
        self.routes: List[Route] = list(routes)
        self._compiled = [(r, r.regex) for r in self.routes]

    def dispatch(self, app, req: Request) -> object:
        for candidate, regex in self._compiled:
            match = regex.match(req.path)
            if match is None or candidate.method != req.method:
                continue
            path_vars = match.groupdict()
            node = path_vars.get("node")
            if node is not None and node not in (app.node, "localhost"):
                raise fail("hostname lookup '%s' failed - failed to get address info for: %s: Name or service "
                           "not known" % (node, node))
            values = dict(req.params)
            values.update(path_vars)
            params = validate(values, candidate.props, candidate.additional)
            permissions.enforce(app, req.method, candidate.template, params, req.user)
            result = candidate.handler(app, params, req)
            return permissions.visible(app, req.method, candidate.template, req.user, result)
        raise ApiError(501, "Method '%s %s' not implemented" % (req.method, req.path))
