#!/usr/bin/python
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gateway_config
short_description: The fleet's front door, an HAProxy configuration generated from the fleet registry
version_added: 0.1.0
description:
  - Reads the fleet registry and writes one HAProxy 2.6 configuration that routes C(POST /v1/chat/completions),
    C(/v1/completions) and C(/v1/embeddings) by the JSON body's C(model) to that model's backend, whose servers
    are the leaders of its Ready replicas only (recorded C(ready), not broken in the solver's sense, on no
    draining node); a replica placing, starting, failed, short of shards or draining is never a server.
  - C(GET /v1/models) is answered by HAProxy itself with the models that have at least one Ready replica. Errors
    are OpenAI-shaped, an unknown model 404 naming the models there are, a known model with no Ready replica
    (or none passing its active C(GET /health) check) 503 with C(Retry-After), a missing or wrong Bearer key 401.
  - Writes the API-key map (mode 0600), the SHA-256 of each key beside its name; the keys themselves are never
    written, logged or returned. The log shows the key's name.
  - Optionally writes a Prometheus C(file_sd) targets file (the gateway's exporter, each Ready leader, each node).
  - Each file is written atomically and only when its content (or mode) changed; the configuration is validated
    with O(validate) before it replaces the old one. The module does not reload HAProxy (the C(llmgw.fleet.gateway)
    role does, when something changed).
  - Every model, replica, key name, address and path that would reach the configuration is checked first; a bad
    one is refused before anything is written, naming the field, the value and the fix.
  - Run it on the gateway host, where the registry is (the controller by default).
extends_documentation_fragment:
  - llmgw.fleet.attributes
attributes:
  check_mode:
    support: full
    details: Computes every file and reports what would change; writes and validates nothing.
  diff_mode:
    support: full
    details: The configuration and the targets file as text; for the key map only the key names.
author:
  - llmgw.fleet developers (@llmgw)
options:
  db:
    description:
      - Path of the registry database. Defaults to E(LLMGW_FLEET_DB), then C($XDG_DATA_HOME/llmgw/fleet.db),
        then C(~/.local/share/llmgw/fleet.db). A registry that does not exist reads as an empty fleet.
    type: path
  api_keys:
    description:
      - The API keys clients send as C(Authorization Bearer <key>), by name (the name is what the log shows).
        At least one; each at least 16 printable characters without spaces, each name its own key.
    type: dict
    required: true
  models:
    description:
      - The models the fleet declares (the keys of C(fleet_models)). Asked for while no replica of theirs is
        Ready they answer 503, not 404. Models of replicas in the registry are known anyway.
    type: list
    elements: str
    default: []
  follow:
    description:
      - Update only a gateway that C(llmgw.fleet.gateway) set up from this same registry, and otherwise change
        nothing and say why in RV(not_following). What C(place_replica), C(reconcile) and removal use, so that a
        run against another registry (a scratch one, a test's) never rewrites the gateway of the real one.
    type: bool
    default: false
  drain:
    description:
      - Replicas about to be removed. Each is left out of the new configuration; before that, when HAProxy answers
        on O(stats_socket), its server is set to C(drain) through the runtime API (no new request goes to it) and
        the module waits until it carries no request, at most O(drain_timeout) seconds, so that nothing in flight
        is cut when its units stop. Not done in check mode.
    type: list
    elements: str
    default: []
  drain_timeout:
    description: How long to wait for the requests in flight on a drained server to finish, in seconds.
    type: int
    default: 300
  config_path:
    description: Where the HAProxy configuration goes.
    type: path
    default: /etc/haproxy/haproxy.cfg
  keys_path:
    description: Where the API-key map goes (mode 0600, its directory 0750).
    type: path
    default: /etc/haproxy/llmgw/api-keys.map
  targets_path:
    description:
      - Where the Prometheus C(file_sd) targets file goes (JSON, mode 0644, a new directory 0755). Omitted, none
        is written.
    type: path
  gateway_target:
    description: The gateway's exporter as Prometheus reaches it, C(host:port), in the targets file.
    type: str
  node_exporter_port:
    description: Port of each node's exporter in the targets file; C(0) lists no node.
    type: int
    default: 9100
  validate:
    description: Command that checks the new configuration before it replaces the old one, C(%s) for its path.
    type: str
  bind_address:
    description: Address the API listens on.
    type: str
    default: 0.0.0.0
  port:
    description: Port of the API (one URL for the whole fleet).
    type: int
    default: 8000
  tls_certificate:
    description: A PEM holding the gateway's certificate, its chain and its key; set, the API speaks HTTPS only.
    type: path
  metrics_address:
    description: Address of the Prometheus exporter (C(/metrics)).
    type: str
    default: 0.0.0.0
  metrics_port:
    description: Port of the Prometheus exporter, its own.
    type: int
    default: 8405
  stats_socket:
    description: The runtime API's socket (C(level admin)); empty for none.
    type: str
    default: /run/haproxy/admin.sock
  log:
    description: Syslog target, C(<address> <facility>); empty for no log.
    type: str
    default: /dev/log local0
  user:
    description: User HAProxy's workers run as; empty to stay as started.
    type: str
    default: haproxy
  group:
    description: Group HAProxy's workers run as; empty to stay as started.
    type: str
    default: haproxy
  chroot:
    description: Directory HAProxy's workers chroot to; empty for none.
    type: str
    default: /var/lib/haproxy
  maxconn:
    description: Connections the gateway holds at once.
    type: int
    default: 4096
  request_buffer:
    description:
      - Bytes of a request HAProxy buffers (C(tune.bufsize)); the C(model) field must lie within them. Each
        connection may hold two such buffers.
    type: int
    default: 262144
  server_timeout:
    description:
      - Seconds a node may stay silent (a whole generation when not streamed, between two events when streamed).
    type: int
    default: 900
  client_timeout:
    description: Seconds a client may stay silent.
    type: int
    default: 900
  connect_timeout:
    description: Seconds to connect to a node.
    type: int
    default: 5
  tunnel_timeout:
    description: Seconds an upgraded connection may stay silent.
    type: int
    default: 3600
  hard_stop_after:
    description: Seconds an old HAProxy process may keep serving its streams after a reload.
    type: int
    default: 3600
  health_interval:
    description: Seconds between two active C(GET /health) checks of a server.
    type: int
    default: 2
  slowstart:
    description: Seconds over which a server back from a failed check gets its full share of requests.
    type: int
    default: 30
  retries:
    description: Connection attempts retried (redispatched to another replica) before any byte of an answer came back.
    type: int
    default: 3
  retry_after:
    description: The C(Retry-After) seconds of a 503.
    type: int
    default: 10
notes:
  - Needs HAProxy 2.6 (Debian 12) or later, for C(json_query), C(sha2) and C(http-request return).
seealso:
  - module: llmgw.fleet.fleet_info
  - module: llmgw.fleet.fleet_replica
"""

EXAMPLES = r"""
- name: Write the gateway's configuration from the registry
  llmgw.fleet.gateway_config:
    api_keys:
      team-a: "{{ vault_gateway_api_keys['team-a'] }}"
    models: "{{ fleet_models | default({}) | list }}"
    validate: haproxy -c -q -f %s
  become: true
  register: gateway

- name: Which models the gateway serves
  ansible.builtin.debug:
    msg: "{{ gateway.models }} (not now: {{ gateway.unavailable_models }})"

- name: A configuration and Prometheus targets for a test directory, on a high port, without TLS
  llmgw.fleet.gateway_config:
    db: /srv/llmgw/fleet.db
    api_keys:
      ci: "{{ lookup('ansible.builtin.env', 'GATEWAY_KEY') }}"
    config_path: /tmp/gateway/haproxy.cfg
    keys_path: /tmp/gateway/api-keys.map
    targets_path: /tmp/gateway/targets.json
    gateway_target: gateway.example.internal:18405
    port: 18000
    metrics_port: 18405
    stats_socket: /tmp/gateway/admin.sock
    log: ""
    user: ""
    group: ""
    chroot: ""
"""

RETURN = r"""
changed:
  description: Whether any file changed (content or mode).
  returned: always
  type: bool
config_changed:
  description: Whether the configuration changed (a reload is needed).
  returned: always
  type: bool
keys_changed:
  description: Whether the key map changed (a reload is needed).
  returned: always
  type: bool
targets_changed:
  description: Whether the targets file changed (Prometheus reads it again by itself).
  returned: always
  type: bool
models:
  description: The models served now (what C(GET /v1/models) lists).
  returned: always
  type: list
  elements: str
  sample: [qwen2.5-coder-7b]
unavailable_models:
  description: Models known but with no Ready replica (they answer 503).
  returned: always
  type: list
  elements: str
backends:
  description: Per served model, its servers (C(replica), C(model), C(node), C(address), C(port)).
  returned: always
  type: dict
excluded:
  description:
    - Replicas left out of every backend, each with C(replica), C(model) and C(why) (for example C(state starting,
      not ready)).
  returned: always
  type: list
  elements: dict
key_names:
  description: The names of the API keys (never the keys).
  returned: always
  type: list
  elements: str
config_path:
  description: The configuration written.
  returned: always
  type: str
following:
  description: Whether the gateway was updated (always true without O(follow)).
  returned: always
  type: bool
not_following:
  description: With O(follow), why this gateway was left as it was (not set up, or set up for another registry).
  returned: when not following
  type: str
  sample: "no configuration at /etc/haproxy/haproxy.cfg: the gateway is not set up (run llmgw.fleet.gateway)"
drained:
  description: Each server drained before it was left out, with C(replica), C(backend), C(waited) seconds and the
    C(sessions) still open when the wait ended (0 unless O(drain_timeout) ran out).
  returned: always
  type: list
  elements: dict
"""

import os
import socket
import tempfile
import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.llmgw.fleet.plugins.module_utils import fleet_registry, placement
from ansible_collections.llmgw.fleet.plugins.module_utils import gateway_config as core

SETTINGS = ("keys_path", "bind_address", "port", "tls_certificate", "metrics_address", "metrics_port", "stats_socket",
            "log", "user", "group", "chroot", "maxconn", "request_buffer", "server_timeout", "client_timeout",
            "connect_timeout", "tunnel_timeout", "hard_stop_after", "health_interval", "slowstart", "retries",
            "retry_after")
OPTIONAL = ("tls_certificate", "stats_socket", "log", "user", "group", "chroot")


def read(path):
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def mode_of(path):
    try:
        return os.stat(path).st_mode & 0o7777
    except FileNotFoundError:
        return None


def write(module, path, content, mode, validate=None, dir_mode=0o750):
    """Atomically: a temporary file beside the target, validated, then renamed over it."""
    directory = os.path.dirname(path)
    if not os.path.isdir(directory):
        os.makedirs(directory, mode=dir_mode)
    fd, tmp = tempfile.mkstemp(prefix=".%s." % os.path.basename(path), dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(content)
        os.chmod(tmp, mode)
        if validate:
            rc, out, err = module.run_command(validate % tmp if "%s" in validate else validate + " " + tmp)
            if rc != 0:
                module.fail_json(msg="the new configuration failed its validation (%s); %s was left as it was: %s"
                                 % (validate, path, (err or out).strip()), config_path=path)
        module.atomic_move(tmp, path)
        os.chmod(path, mode)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def runtime_api(path, command):
    """One command on HAProxy's stats socket; its answer."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(path)
        sock.sendall(command.encode() + b"\n")
        data = b""
        while True:
            part = sock.recv(65536)
            if not part:
                return data.decode("utf-8", "replace")
            data += part


def drain(module, stats_socket, replicas, models_of, timeout):
    """Set each replica's server to drain and wait until none carries a request (or the time is up)."""
    if not replicas or not stats_socket or not os.path.exists(stats_socket):
        return []
    try:
        sessions = core.server_sessions(runtime_api(stats_socket, "show stat"))
        targets = [(core.backend_name(models_of[name]), name) for name in replicas
                   if (core.backend_name(models_of.get(name, "-")), name) in sessions]
        for backend, server in targets:
            runtime_api(stats_socket, "set server %s/%s state drain" % (backend, server))
        started = time.monotonic()
        while True:
            sessions = core.server_sessions(runtime_api(stats_socket, "show stat"))
            left = {t: sessions.get(t, 0) for t in targets}
            if not any(left.values()) or time.monotonic() - started >= timeout:
                break
            time.sleep(0.5)
    except OSError as exc:
        module.warn("could not drain %s through %s (%s): requests in flight on it may be cut"
                    % (", ".join(replicas), stats_socket, exc))
        return []
    waited = round(time.monotonic() - started, 1)
    return [{"replica": server, "backend": backend, "waited": waited, "sessions": left[(backend, server)]}
            for backend, server in targets]


def main():
    module = AnsibleModule(
        argument_spec=dict(
            db=dict(type="path"),
            api_keys=dict(type="dict", required=True, no_log=True),
            models=dict(type="list", elements="str", default=[]),
            config_path=dict(type="path", default="/etc/haproxy/haproxy.cfg"),
            keys_path=dict(type="path", default="/etc/haproxy/llmgw/api-keys.map", no_log=False),
            targets_path=dict(type="path"),
            follow=dict(type="bool", default=False),
            drain=dict(type="list", elements="str", default=[]),
            drain_timeout=dict(type="int", default=300),
            gateway_target=dict(type="str"),
            node_exporter_port=dict(type="int", default=9100),
            validate=dict(type="str"),
            bind_address=dict(type="str", default="0.0.0.0"),
            port=dict(type="int", default=8000),
            tls_certificate=dict(type="path"),
            metrics_address=dict(type="str", default="0.0.0.0"),
            metrics_port=dict(type="int", default=8405),
            stats_socket=dict(type="str", default="/run/haproxy/admin.sock"),
            log=dict(type="str", default="/dev/log local0"),
            user=dict(type="str", default="haproxy"),
            group=dict(type="str", default="haproxy"),
            chroot=dict(type="str", default="/var/lib/haproxy"),
            maxconn=dict(type="int", default=4096),
            request_buffer=dict(type="int", default=262144),
            server_timeout=dict(type="int", default=900),
            client_timeout=dict(type="int", default=900),
            connect_timeout=dict(type="int", default=5),
            tunnel_timeout=dict(type="int", default=3600),
            hard_stop_after=dict(type="int", default=3600),
            health_interval=dict(type="int", default=2),
            slowstart=dict(type="int", default=30),
            retries=dict(type="int", default=3),
            retry_after=dict(type="int", default=10),
        ),
        supports_check_mode=True,
    )
    p = module.params
    settings = {k: p[k] for k in SETTINGS}
    for key in OPTIONAL:
        if settings[key] == "":
            settings[key] = None
    path = fleet_registry.resolve_path(p["db"])
    old_config = read(p["config_path"])
    if p["follow"]:
        serves = core.registry_of(old_config)
        why = None
        if old_config is None:
            why = "no configuration at %s: the gateway is not set up (run llmgw.fleet.gateway)" % p["config_path"]
        elif serves is None:
            why = "%s was not written by llmgw.fleet.gateway for a registry: run llmgw.fleet.gateway" % p["config_path"]
        elif serves != path:
            why = "this gateway serves the registry %s, not %s" % (serves, path)
        if why:
            module.exit_json(changed=False, config_changed=False, keys_changed=False, targets_changed=False,
                             following=False, not_following=why, models=[], unavailable_models=[], backends={},
                             excluded=[], key_names=[], drained=[], config_path=p["config_path"], db=path)
    try:
        settings = core.Settings(**settings).checked()
        for target in ("config_path", "targets_path"):
            if p[target] is not None:
                core.check_path(p[target], target)
        keys_text = core.keys_map(p["api_keys"])
        if os.path.exists(path):
            with fleet_registry.FleetRegistry(path, create=False) as registry:
                routes = core.read_routes(registry, p["models"], p["drain"])
        else:
            routes = core.routes([], [], placement.Fleet([]), p["models"], p["drain"])
        config_text = core.render(routes, settings, path)
        targets_text = None
        if p["targets_path"]:
            targets_text = core.file_sd(routes, p["gateway_target"], p["node_exporter_port"] or None)
    except (core.GatewayConfigError, fleet_registry.RegistryError) as exc:
        module.fail_json(msg=str(exc), db=path)

    key_names = sorted(p["api_keys"])
    old_keys = read(settings.keys_path)
    old_names = sorted(line.split(" ", 1)[1] for line in (old_keys or "").splitlines() if " " in line)
    keys_changed = old_keys != keys_text or mode_of(settings.keys_path) != 0o600
    config_changed = old_config != config_text or mode_of(p["config_path"]) != 0o640
    old_targets = read(p["targets_path"]) if p["targets_path"] else None
    targets_changed = bool(p["targets_path"]) and (old_targets != targets_text or
                                                   mode_of(p["targets_path"]) != 0o644)

    drained = []
    if not module.check_mode:
        models_of = {e["replica"]: e["model"] for e in routes.excluded}
        drained = drain(module, settings.stats_socket, p["drain"], models_of, p["drain_timeout"])
        if keys_changed:
            write(module, settings.keys_path, keys_text, 0o600)
        if config_changed:
            write(module, p["config_path"], config_text, 0o640, p["validate"])
        if targets_changed:
            write(module, p["targets_path"], targets_text, 0o644, dir_mode=0o755)

    result = dict(changed=keys_changed or config_changed or targets_changed, config_changed=config_changed,
                  keys_changed=keys_changed, targets_changed=targets_changed, key_names=key_names,
                  following=True, drained=drained,
                  config_path=p["config_path"], db=path, **routes.to_dict())
    if module._diff:
        diffs = [{"before_header": p["config_path"], "after_header": p["config_path"],
                  "before": old_config or "", "after": config_text},
                 {"before_header": "%s (key names)" % settings.keys_path,
                  "after_header": "%s (key names)" % settings.keys_path,
                  "before": "\n".join(old_names) + ("\n" if old_names else ""),
                  "after": "\n".join(key_names) + "\n"}]
        if p["targets_path"]:
            diffs.append({"before_header": p["targets_path"], "after_header": p["targets_path"],
                          "before": old_targets or "", "after": targets_text})
        result["diff"] = diffs
    module.exit_json(**result)


if __name__ == "__main__":
    main()
