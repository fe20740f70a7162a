"""The node's storages as a default PVE install has them: `local` (directory) and `local-lvm` (LVM thin)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Dict, Optional

from pve_lab.api.errors import ApiError, fail, param_error


@dataclass(frozen=True)
class Storage:
    storeid: str
    type: str
    content: str
    default_format: str
    shared: int = 0

    @property
    def has_images(self) -> bool:
        return "images" in self.content.split(",")


STORAGES: Dict[str, Storage] = {
    "local": Storage("local", "dir", "backup,iso,vztmpl,snippets", "qcow2"),
    "local-lvm": Storage("local-lvm", "lvmthin", "images,rootdir", "raw"),
}
UNITS = {"": 1, "K": 1024, "M": 1024 ** 2, "G": 1024 ** 3, "T": 1024 ** 4}


def storage(storeid: str) -> Storage:
    if storeid not in STORAGES:
        raise fail("storage '%s' does not exist" % storeid)
    return STORAGES[storeid]


def image_storage(storeid: str, param: str = "storage") -> Storage:
    store = storage(storeid)
    if not store.has_images:
        raise param_error({param: "storage '%s' does not support vm images" % storeid})
    return store


def parse_size(text: str) -> int:
    match = re.match(r"^(\d+(?:\.\d+)?)([KMGT]?)$", text)
    if not match:
        raise ApiError(400, "unable to parse size '%s'" % text)
    return int(float(match.group(1)) * UNITS[match.group(2)])


def format_size(size: int) -> str:
    """PVE::JSONSchema::format_size: the largest unit that divides the size."""
    for unit in ("T", "G", "M", "K"):
        if size % UNITS[unit] == 0:
            return "%d%s" % (size // UNITS[unit], unit)
    return str(size)


def volume_name(store: Storage, vmid: int, name: str, fmt: Optional[str]) -> str:
    if store.type == "dir":
        return "%s:%d/%s.%s" % (store.storeid, vmid, name, fmt or store.default_format)
    return "%s:%s" % (store.storeid, name)


def filesystem_usage() -> Dict[str, int]:
    stats = os.statvfs("/")
    total = stats.f_blocks * stats.f_frsize
    avail = stats.f_bavail * stats.f_frsize
    return {"total": total, "avail": avail, "used": total - stats.f_bfree * stats.f_frsize}
