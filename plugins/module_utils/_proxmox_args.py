# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The connection options every Proxmox module shares (documented by the ``llmgw.fleet.proxmox`` fragment)."""

from __future__ import annotations

from ansible.module_utils.basic import env_fallback

from ansible_collections.llmgw.fleet.plugins.module_utils.proxmox_client import ENV_FALLBACKS


def _env(key):
    return (env_fallback, [ENV_FALLBACKS[key]])


def proxmox_argument_spec():
    return dict(
        api_host=dict(type="str", fallback=_env("api_host")),
        api_port=dict(type="int", fallback=_env("api_port")),
        api_user=dict(type="str", fallback=_env("api_user")),
        api_password=dict(type="str", no_log=True, fallback=_env("api_password")),
        api_token_id=dict(type="str", fallback=_env("api_token_id")),
        api_token_secret=dict(type="str", no_log=True, fallback=_env("api_token_secret")),
        validate_certs=dict(type="bool", default=True),
        ca_path=dict(type="path", fallback=_env("ca_path")),
        api_timeout=dict(type="int", default=30),
        write_concurrency=dict(type="int", default=4),
    )


PROXMOX_REQUIRED_TOGETHER = [["api_token_id", "api_token_secret"]]

UNVERIFIED_WARNING = (
    "validate_certs is false: the Proxmox VE API's certificate is not checked, so whoever sits between this host "
    "and the API can read the token or password sent to it; give ca_path (the cluster's CA, "
    "/etc/pve/pve-root-ca.pem) instead, or trust the CA on this host")


def warn_if_unverified(module):
    """TLS to the API is verified unless an option turns it off, and then every run says so."""
    if module.params.get("validate_certs") is False:
        module.warn(UNVERIFIED_WARNING)
