"""The lab's secrets: root@pam's password, the API token secret and the key that signs tickets."""

from __future__ import annotations

import json
import os
import secrets
import uuid
from dataclasses import asdict, dataclass

from pve_lab.api.constants import LabPaths


@dataclass(frozen=True)
class Credentials:
    password: str
    token_secret: str
    ticket_key: str
    fleet_token_secret: str = ""  # llmgw@pve!fleet, the privilege-separated token (api/permissions.py)


def load_or_create(paths: LabPaths) -> Credentials:
    """Reads .lab/api/secrets.json, creating it (mode 0600) on first use, so tickets and tokens survive restarts."""
    if os.path.exists(paths.secrets_file):
        with open(paths.secrets_file) as handle:
            creds = Credentials(**json.load(handle))
        if creds.fleet_token_secret:
            return creds
        creds = Credentials(**{**asdict(creds), "fleet_token_secret": str(uuid.uuid4())})  # a lab made before it
    else:
        creds = Credentials(password=secrets.token_urlsafe(18), token_secret=str(uuid.uuid4()),
                            ticket_key=secrets.token_hex(32), fleet_token_secret=str(uuid.uuid4()))
    os.makedirs(paths.api_dir, exist_ok=True)
    fd = os.open(paths.secrets_file + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(asdict(creds), handle)
    os.replace(paths.secrets_file + ".tmp", paths.secrets_file)
    return creds
