# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Every input checked before it reaches the gateway's configuration: the safe tokens (model, replica and key
names, hosts, ports, paths), the API keys, and :class:`Settings`, everything about the gateway that is not the
fleet; :class:`GatewayConfigError` names the field, the value and the fix.

Private to :mod:`gateway_config` (which re-exports the public names); pure: no I/O.
"""

from __future__ import annotations

import dataclasses
import hashlib
import ipaddress
import json
import re
from typing import Dict, Mapping, Optional

# HAProxy names (proxies, servers) take letters, digits, '-', '_', '.' and ':'; JSON strings and ACL patterns
# then need no quoting. Model names are what clients send as "model".
MODEL_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,99}$")
REPLICA_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
KEY_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$")
_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
HOST_RE = re.compile(r"^(?=.{1,253}$)%s(\.%s)*$" % (_LABEL, _LABEL))
PATH_RE = re.compile(r"^/[A-Za-z0-9._/@+-]*$")
KEY_RE = re.compile(r"^[\x21-\x7e]+$")
MIN_KEY_LENGTH = 16
LOG_RE = re.compile(r"^[A-Za-z0-9./:@_-]+( [A-Za-z0-9./:@_-]+)*$")


class GatewayConfigError(ValueError):
    """Input that cannot go into the configuration: names the field, the value and the fix."""

    def __init__(self, field: str, value, problem: str, fix: str):
        self.field, self.value, self.problem, self.fix = field, value, problem, fix
        super().__init__("%s=%s: %s; %s" % (field, json.dumps(value), problem, fix))


def check_model(value, field: str = "model") -> str:
    if not isinstance(value, str) or not MODEL_RE.match(value):
        raise GatewayConfigError(field, value, "not a safe model name",
                                 "name the model with letters, digits, '.', '_', ':' and '-' (at most 100, first a "
                                 "letter or digit), e.g. qwen2.5-coder-7b, and declare it under that name in "
                                 "fleet_models")
    return value


def check_replica_name(value, field: str = "replica") -> str:
    if not isinstance(value, str) or not REPLICA_RE.match(value):
        raise GatewayConfigError(field, value, "not a safe replica name",
                                 "remove the replica and place it again under a name of lower case letters, digits "
                                 "and '-' (as place_replica asks)")
    return value


def check_host(value, field: str) -> str:
    if isinstance(value, str):
        try:
            ipaddress.ip_address(value)
            return value
        except ValueError:
            if HOST_RE.match(value):
                return value
    raise GatewayConfigError(field, value, "not an IP address or a DNS name",
                             "give an IPv4 or IPv6 address, or a host name of letters, digits, '-' and '.'")


def check_port(value, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise GatewayConfigError(field, value, "not a TCP port", "give an integer from 1 to 65535")
    return value


def check_path(value, field: str) -> str:
    if not isinstance(value, str) or not PATH_RE.match(value) or "/../" in value + "/":
        raise GatewayConfigError(field, value, "not a safe absolute path",
                                 "give an absolute path of letters, digits and '._/@+-' (no spaces, quotes or '..')")
    return value


def check_positive(value, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise GatewayConfigError(field, value, "not a positive integer", "give an integer of at least 1")
    return value


def check_api_keys(api_keys) -> Dict[str, str]:
    """{name: key}. A key's value is never repeated in an error: its name is."""
    if not isinstance(api_keys, Mapping) or not api_keys:
        raise GatewayConfigError("api_keys", "(%d keys)" % (len(api_keys) if isinstance(api_keys, Mapping) else 0),
                                 "the gateway needs at least one API key",
                                 "set fleet_gateway_api_keys to {name: key}, the keys in the vault")
    out = {}
    digests: Dict[str, str] = {}
    for name, key in sorted(api_keys.items(), key=lambda item: str(item[0])):
        if not isinstance(name, str) or not KEY_NAME_RE.match(name):
            raise GatewayConfigError("api_keys name", name, "not a safe key name (the log shows it)",
                                     "name each key with letters, digits and '._@-', e.g. team-a")
        if not isinstance(key, str) or len(key) < MIN_KEY_LENGTH or not KEY_RE.match(key):
            raise GatewayConfigError("api_keys[%s]" % name, "(value hidden)",
                                     "a key must be at least %d printable ASCII characters without spaces"
                                     % MIN_KEY_LENGTH,
                                     "generate one, e.g. `openssl rand -hex 24`, and put it in the vault")
        digest = key_digest(key)
        if digest in digests:
            raise GatewayConfigError("api_keys[%s]" % name, "(value hidden)",
                                     "the same key as api_keys[%s]" % digests[digest], "give each name its own key")
        digests[digest] = name
        out[name] = key
    return out


def key_digest(key: str) -> str:
    return hashlib.sha256(key.encode("ascii")).hexdigest()


@dataclasses.dataclass(frozen=True)
class Settings:
    """Everything about the gateway that is not the fleet. Times are seconds."""

    keys_path: str = "/etc/haproxy/llmgw/api-keys.map"
    bind_address: str = "0.0.0.0"
    port: int = 8000
    tls_certificate: Optional[str] = None   # a PEM with the certificate, its chain and its key
    metrics_address: str = "0.0.0.0"
    metrics_port: int = 8405
    stats_socket: Optional[str] = "/run/haproxy/admin.sock"
    log: Optional[str] = "/dev/log local0"
    user: Optional[str] = "haproxy"
    group: Optional[str] = "haproxy"
    chroot: Optional[str] = "/var/lib/haproxy"
    maxconn: int = 4096
    request_buffer: int = 262144            # tune.bufsize: a request body larger than this is not read whole
    connect_timeout: int = 5
    server_timeout: int = 900               # the longest silence from a node: a whole non-streamed generation
    client_timeout: int = 900
    tunnel_timeout: int = 3600
    request_timeout: int = 30               # headers and body of one request
    queue_timeout: int = 30
    keepalive_timeout: int = 10
    hard_stop_after: int = 3600             # how long an old process may keep streams alive after a reload
    health_path: str = "/health"
    health_interval: int = 2
    health_fall: int = 2
    health_rise: int = 2
    slowstart: int = 30
    retries: int = 3
    retry_after: int = 10

    def checked(self) -> Settings:
        check_path(self.keys_path, "keys_path")
        for field in ("bind_address", "metrics_address"):
            value = getattr(self, field)
            try:
                ipaddress.ip_address(value)
            except (TypeError, ValueError):
                raise GatewayConfigError(field, value, "not an IP address to listen on",
                                         "give an IPv4 or IPv6 address, 0.0.0.0 for every IPv4 address")
        check_port(self.port, "port")
        check_port(self.metrics_port, "metrics_port")
        if self.port == self.metrics_port and self.bind_address == self.metrics_address:
            raise GatewayConfigError("metrics_port", self.metrics_port, "the same as port",
                                     "give the Prometheus exporter its own port")
        for field in ("tls_certificate", "stats_socket", "chroot"):
            if getattr(self, field) is not None:
                check_path(getattr(self, field), field)
        if not isinstance(self.health_path, str) or not PATH_RE.match(self.health_path):
            raise GatewayConfigError("health_path", self.health_path, "not a safe URL path",
                                     "give a path such as /health")
        for field in ("user", "group"):
            value = getattr(self, field)
            if value is not None and not (isinstance(value, str) and re.match(r"^[a-z_][a-z0-9_-]{0,31}$", value)):
                raise GatewayConfigError(field, value, "not a system user or group name", "give one such as haproxy")
        if self.log is not None and (not isinstance(self.log, str) or not LOG_RE.match(self.log)):
            raise GatewayConfigError("log", self.log, "not a syslog target HAProxy takes",
                                     "give '<address> <facility>', e.g. '/dev/log local0', or none")
        for field in ("maxconn", "request_buffer", "connect_timeout", "server_timeout", "client_timeout",
                      "tunnel_timeout", "request_timeout", "queue_timeout", "keepalive_timeout", "hard_stop_after",
                      "health_interval", "health_fall", "health_rise", "slowstart", "retry_after"):
            check_positive(getattr(self, field), field)
        if self.request_buffer < 16384:
            raise GatewayConfigError("request_buffer", self.request_buffer, "below HAProxy's default of 16384",
                                     "give at least 16384 bytes (a chat request with its history must fit)")
        if isinstance(self.retries, bool) or not isinstance(self.retries, int) or self.retries < 0:
            raise GatewayConfigError("retries", self.retries, "not a count", "give an integer of at least 0")
        return self
