# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""How the client reaches and authenticates to the Proxmox VE API: :class:`ConnectionSettings`, built from
module-style parameters by :func:`settings_from_params` (each falling back to its ``PROXMOX_*`` environment
variable, :data:`ENV_FALLBACKS`), with the default port, HTTP timeout and write concurrency.

Private to :mod:`proxmox_client` (which re-exports the public names); pure: no I/O (the environment is a mapping
the caller passes).
"""

from __future__ import annotations

from collections import namedtuple

from ansible_collections.llmgw.fleet.plugins.module_utils.proxmox_errors import ProxmoxError

DEFAULT_PORT = 8006
DEFAULT_HTTP_TIMEOUT = 30
DEFAULT_WRITE_CONCURRENCY = 4

ENV_FALLBACKS = {
    "api_host": "PROXMOX_HOST",
    "api_port": "PROXMOX_PORT",
    "api_user": "PROXMOX_USER",
    "api_password": "PROXMOX_PASSWORD",
    "api_token_id": "PROXMOX_TOKEN_ID",
    "api_token_secret": "PROXMOX_TOKEN_SECRET",
    "ca_path": "PROXMOX_CA_PATH",
    "node": "PROXMOX_NODE",
}


class ConnectionSettings(
    namedtuple(
        "ConnectionSettings",
        ["host", "port", "user", "password", "token_id", "token_secret", "validate_certs", "ca_path", "timeout",
         "write_concurrency"],
        defaults=(DEFAULT_WRITE_CONCURRENCY,),
    )
):
    """How to reach and authenticate to the API. Build it with ``settings_from_params``."""

    __slots__ = ()

    @property
    def auth_method(self):
        return "token" if self.token_id else "password"

    @property
    def verify(self):
        """What requests takes as ``verify``: a CA file, True, or False."""
        if not self.validate_certs:
            return False
        return self.ca_path or True


def settings_from_params(params, environ=None):
    """ConnectionSettings from module-style parameters, falling back to ``PROXMOX_*`` environment variables.

    Raises ProxmoxError naming what is missing. A token id may be given whole (``user@realm!name``), in which
    case it also supplies the user.
    """
    environ = environ or {}

    def pick(key):
        value = params.get(key)
        if value in (None, "") and key in ENV_FALLBACKS:
            value = environ.get(ENV_FALLBACKS[key])
        return value if value not in ("",) else None

    host = pick("api_host")
    user = pick("api_user")
    password = pick("api_password")
    token_id = pick("api_token_id")
    token_secret = pick("api_token_secret")
    if token_id and "!" in token_id:
        token_user, token_id = token_id.split("!", 1)
        if user and user != token_user:
            raise ProxmoxError(
                "api_token_id names user %s but api_user is %s; give one or make them agree" % (token_user, user)
            )
        user = token_user
    missing = [name for name, value in (("api_host", host), ("api_user", user)) if not value]
    if token_id and not token_secret:
        missing.append("api_token_secret")
    if not token_id and not password:
        missing.append("api_password (or api_token_id and api_token_secret)")
    if missing:
        raise ProxmoxError(
            "missing Proxmox connection parameters: %s (each also reads its PROXMOX_* environment variable)"
            % ", ".join(missing)
        )
    port = pick("api_port")
    validate_certs = params.get("validate_certs")
    return ConnectionSettings(
        host=host,
        port=int(port) if port else DEFAULT_PORT,
        user=user,
        password=password if not token_id else None,
        token_id=token_id,
        token_secret=token_secret if token_id else None,
        validate_certs=True if validate_certs is None else bool(validate_certs),
        ca_path=pick("ca_path"),
        timeout=int(params.get("api_timeout") or DEFAULT_HTTP_TIMEOUT),
        write_concurrency=_write_concurrency(params.get("write_concurrency")),
    )


def _write_concurrency(value):
    if value is None:
        return DEFAULT_WRITE_CONCURRENCY
    try:
        count = int(value)
    except (TypeError, ValueError):
        count = -1
    if count < 0:
        raise ProxmoxError(
            "write_concurrency must be a count of API writes at once (0 for no limit), got %r: set "
            "fleet_proxmox.write_concurrency to a whole number such as %d" % (value, DEFAULT_WRITE_CONCURRENCY)
        )
    return count
