"""Checks qemu-server makes on config parameters before it locks or forks anything."""

from __future__ import annotations

import os
import subprocess
import tempfile
from typing import Dict
from urllib.parse import unquote

from pve_lab.api import storage, vm_config
from pve_lab.api.errors import fail
from pve_lab.api.qemu_schema import CONFIG_PROPS, DRIVE_FORMAT, is_drive
from pve_lab.api.state import LabState


def config_params(params: Dict[str, object]) -> Dict[str, str]:
    """The VM config keys among validated parameters, as the strings the config file holds."""
    return {k: str(v) for k, v in params.items() if k in CONFIG_PROPS}


def validate_ssh_public_keys(encoded: str) -> None:
    """PVE::Tools::validate_ssh_public_keys on the URL-decoded value: each line must be a key ssh-keygen reads."""
    try:
        keys = unquote(encoded, errors="strict")
    except UnicodeDecodeError:
        raise fail("SSH public key validation error")
    for line in keys.split("\n"):
        if not line.strip():
            continue
        with tempfile.NamedTemporaryFile("w", suffix=".pub", delete=False) as handle:
            handle.write(line + "\n")
        try:
            result = subprocess.run(["ssh-keygen", "-l", "-f", handle.name], capture_output=True, check=False)
        finally:
            os.unlink(handle.name)
        if result.returncode != 0:
            raise fail("SSH public key validation error")


def check_storage_access(state: LabState, params: Dict[str, str], default_storage=None) -> None:
    """check_storage_access: new disks need a storage with `images`, named volumes must exist."""
    for key, value in params.items():
        if not is_drive(key):
            continue
        file = DRIVE_FORMAT.parse(value, key)["file"]
        if file in ("none", "cdrom") or file.startswith("/") or file == "cloudinit":
            continue
        if file.endswith(":cloudinit"):
            storage.storage(file.rsplit(":", 1)[0])
            continue
        new_disk = vm_config.NEW_DISK_RE.match(file)
        if new_disk:
            storeid = new_disk.group(2) or default_storage
            if not storeid:
                raise fail("no storage ID specified (and no default storage)")
            storage.image_storage(storeid)
            continue
        storage.storage(file.split(":", 1)[0])
        if file not in state.volumes:
            raise fail("volume '%s' does not exist" % file)


def prepare(state: LabState, params: Dict[str, str], default_storage=None) -> Dict[str, str]:
    """Early checks shared by create and update; returns the params with MACs added to new NICs."""
    if "sshkeys" in params:
        validate_ssh_public_keys(params["sshkeys"])
    check_storage_access(state, params, default_storage)
    return {k: vm_config.with_mac(v) if k.startswith("net") and k[3:].isdigit() else v for k, v in params.items()}
