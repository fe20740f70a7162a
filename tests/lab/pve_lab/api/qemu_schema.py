"""The VM configuration schema (qemu-server's json_config_properties) for the keys the lab accepts."""

from __future__ import annotations

import re
from typing import Dict

from pve_lab.api.propstr import PropString
from pve_lab.api.schema import (
    FormatError,
    Prop,
    address_list_format,
    cidr_format,
    dns_name_format,
    ipv4_format,
    ipv6_format,
    mac_format,
    tag_list_format,
    urlencoded_format,
)


def _words(text: str) -> list:
    return text.split()


BOOL = Prop(type="boolean")
INT = Prop(type="integer")
STR = Prop()

CPU_MODELS = _words(
    "486 athlon Broadwell Broadwell-IBRS Broadwell-noTSX Broadwell-noTSX-IBRS Cascadelake-Server "
    "Cascadelake-Server-noTSX Cascadelake-Server-v2 Cascadelake-Server-v4 Cascadelake-Server-v5 Conroe "
    "Cooperlake Cooperlake-v2 core2duo coreduo EPYC EPYC-Genoa EPYC-IBPB EPYC-Milan EPYC-Milan-v2 "
    "EPYC-Rome EPYC-Rome-v2 EPYC-Rome-v3 EPYC-Rome-v4 EPYC-v3 EPYC-v4 GraniteRapids Haswell Haswell-IBRS "
    "Haswell-noTSX Haswell-noTSX-IBRS host Icelake-Client Icelake-Client-noTSX Icelake-Server "
    "Icelake-Server-noTSX Icelake-Server-v3 Icelake-Server-v4 Icelake-Server-v5 Icelake-Server-v6 "
    "IvyBridge IvyBridge-IBRS KnightsMill kvm32 kvm64 max Nehalem Nehalem-IBRS Opteron_G1 Opteron_G2 "
    "Opteron_G3 Opteron_G4 Opteron_G5 Penryn pentium pentium2 pentium3 phenom qemu32 qemu64 SandyBridge "
    "SandyBridge-IBRS SapphireRapids SapphireRapids-v2 Skylake-Client Skylake-Client-IBRS "
    "Skylake-Client-noTSX-IBRS Skylake-Client-v4 Skylake-Server Skylake-Server-IBRS "
    "Skylake-Server-noTSX-IBRS Skylake-Server-v4 Skylake-Server-v5 Westmere Westmere-IBRS x86-64-v2 "
    "x86-64-v2-AES x86-64-v3 x86-64-v4"
)
NIC_MODELS = _words(
    "e1000 e1000-82540em e1000-82544gc e1000-82545em e1000e i82551 i82557b i82559er ne2k_isa ne2k_pci "
    "pcnet rtl8139 virtio vmxnet3"
)
LOCKS = ["backup", "clone", "create", "migrate", "rollback", "snapshot", "snapshot-delete", "suspending", "suspended"]
DRIVE_BUSES = {"ide": 4, "sata": 6, "scsi": 31, "virtio": 16}
DRIVE_KEYS = frozenset(
    ["efidisk0", "tpmstate0"] + ["%s%d" % (bus, i) for bus, n in DRIVE_BUSES.items() for i in range(n)]
)
SIZE_PATTERN = r"\d+(\.\d+)?[KMGT]?"


def _cputype(values: Dict[str, str]) -> None:
    cputype = values.get("cputype", "kvm64")
    if cputype.startswith("custom-"):
        raise FormatError("Custom cputype '%s' not found\n" % cputype[len("custom-") :])
    if cputype not in CPU_MODELS:
        raise FormatError("Built-in cputype '%s' is not defined (missing 'custom-' prefix?)\n" % cputype)


CPU_FORMAT = PropString(
    keys={
        "cputype": Prop(),
        "flags": Prop(pattern=r"(?:[+-][a-zA-Z0-9\-_\.]+)(?:;[+-][a-zA-Z0-9\-_\.]+)*"),
        "hidden": BOOL,
        "hv-vendor-id": Prop(pattern=r"[a-zA-Z0-9]{1,12}"),
        "phys-bits": Prop(pattern=r"(host|\d+)"),
        "guest-phys-bits": Prop(type="integer", minimum=32, maximum=64),
        "reported-model": Prop(enum=[m for m in CPU_MODELS if m not in ("host", "max")]),
    },
    default_key="cputype",
    validator=_cputype,
)

MEMORY_FORMAT = PropString(
    keys={"current": Prop(type="integer", minimum=16, maximum=8 * 1024 * 1024)}, default_key="current"
)

NET_FORMAT = PropString(
    keys={
        "model": Prop(optional=False, enum=NIC_MODELS),
        "macaddr": Prop(format=mac_format),
        "bridge": Prop(pattern=r"[-_.\w\d]+"),
        "firewall": BOOL,
        "link_down": BOOL,
        "mtu": Prop(type="integer", minimum=1, maximum=65520),
        "queues": Prop(type="integer", minimum=0, maximum=64),
        "rate": Prop(type="number", minimum=0),
        "tag": Prop(type="integer", minimum=1, maximum=4094),
        "trunks": Prop(pattern=r"\d+(?:-\d+)?(?:;\d+(?:-\d+)?)*"),
    },
    default_key="model",
    aliases={model: "macaddr" for model in NIC_MODELS},
    key_alias="model",
)


def _ipv4_config(value: str) -> None:
    if value not in ("dhcp", "manual"):
        try:
            cidr_format(4)(value)
        except FormatError:
            raise FormatError("value does not look like a valid ipv4 network configuration\n")


def _ipv6_config(value: str) -> None:
    if value not in ("auto", "dhcp", "manual"):
        try:
            cidr_format(6)(value)
        except FormatError:
            raise FormatError("value does not look like a valid ipv6 network configuration\n")


IPCONFIG_FORMAT = PropString(
    keys={
        "ip": Prop(format=_ipv4_config),
        "gw": Prop(format=ipv4_format),
        "ip6": Prop(format=_ipv6_config),
        "gw6": Prop(format=ipv6_format),
    }
)

AGENT_FORMAT = PropString(
    keys={
        "enabled": BOOL,
        "fstrim_cloned_disks": BOOL,
        "freeze-fs-on-backup": BOOL,
        "freeze-fs": BOOL,
        "type": Prop(enum=["virtio", "isa"]),
    },
    default_key="enabled",
)

VGA_FORMAT = PropString(
    keys={
        "type": Prop(
            enum=_words("cirrus qxl qxl2 qxl3 qxl4 none serial0 serial1 serial2 serial3 std virtio virtio-gl vmware")
        ),
        "memory": Prop(type="integer", minimum=4, maximum=512),
        "clipboard": Prop(enum=["vnc"]),
    },
    default_key="type",
)


def _boot_order(value: str) -> None:
    for device in re.split(r"[;,\s]+", value):
        if device and not re.match(r"^(ide|sata|scsi|virtio|efidisk|tpmstate|net|hostpci|usb)\d+$", device):
            raise FormatError("invalid boot device '%s'\n" % device)


BOOT_FORMAT = PropString(
    keys={"legacy": Prop(pattern=r"[acdn]{1,4}"), "order": Prop(format=_boot_order)}, default_key="legacy"
)

DRIVE_FORMAT = PropString(
    keys={
        "file": Prop(optional=False),
        "media": Prop(enum=["cdrom", "disk"]),
        "size": Prop(pattern=SIZE_PATTERN),
        "cache": Prop(enum=["none", "writethrough", "writeback", "unsafe", "directsync"]),
        "discard": Prop(enum=["ignore", "on"]),
        "format": Prop(enum=["raw", "cow", "qcow", "qed", "qcow2", "vmdk", "cloop"]),
        "aio": Prop(enum=["native", "threads", "io_uring"]),
        "rerror": Prop(enum=["ignore", "report", "stop"]),
        "werror": Prop(enum=["enospc", "ignore", "report", "stop"]),
        "trans": Prop(enum=["none", "lba", "auto"]),
        "efitype": Prop(enum=["2m", "4m"]),
        "version": Prop(enum=["v1.2", "v2.0"]),
        "queues": Prop(type="integer", minimum=2),
        "cyls": INT,
        "heads": INT,
        "secs": INT,
        **{
            key: BOOL
            for key in (
                "iothread",
                "ssd",
                "backup",
                "replicate",
                "ro",
                "snapshot",
                "detect_zeroes",
                "shared",
                "scsiblock",
                "pre-enrolled-keys",
                "removable",
            )
        },
        **{key: STR for key in ("serial", "wwn", "model", "product", "vendor", "import-from", "ms-cert")},
        **{key: Prop(type="number", minimum=1) for key in ("mbps", "mbps_rd", "mbps_wr", "iops", "iops_rd", "iops_wr")},
    },
    default_key="file",
)


def _drive_format(key: str):
    return DRIVE_FORMAT.check(key)


def _config_props() -> Dict[str, Prop]:
    props: Dict[str, Prop] = {
        "name": Prop(format=dns_name_format),
        "description": Prop(max_length=8192),
        "tags": Prop(format=tag_list_format),
        "cores": Prop(type="integer", minimum=1),
        "sockets": Prop(type="integer", minimum=1),
        "vcpus": Prop(type="integer", minimum=1),
        "memory": Prop(format=MEMORY_FORMAT.check("memory")),
        "balloon": Prop(type="integer", minimum=0),
        "shares": Prop(type="integer", minimum=0, maximum=50000),
        "cpu": Prop(format=CPU_FORMAT.check("cpu")),
        "cpulimit": Prop(type="number", minimum=0, maximum=128),
        "cpuunits": Prop(type="integer", minimum=1, maximum=262144),
        "affinity": STR,
        "numa": BOOL,
        "hugepages": Prop(enum=["any", "2", "1024"]),
        "scsihw": Prop(enum=["lsi", "lsi53c810", "virtio-scsi-pci", "virtio-scsi-single", "megasas", "pvscsi"]),
        "boot": Prop(format=BOOT_FORMAT.check("boot")),
        "bootdisk": Prop(pattern=r"(ide|sata|scsi|virtio)\d+"),
        "ostype": Prop(enum=_words("other wxp w2k w2k3 w2k8 wvista win7 win8 win10 win11 l24 l26 solaris")),
        "agent": Prop(format=AGENT_FORMAT.check("agent")),
        "vga": Prop(format=VGA_FORMAT.check("vga")),
        "ciuser": STR,
        "cipassword": STR,
        "citype": Prop(enum=["configdrive2", "nocloud", "opennebula"]),
        "ciupgrade": BOOL,
        "cicustom": STR,
        "sshkeys": Prop(format=urlencoded_format),
        "nameserver": Prop(format=address_list_format),
        "searchdomain": STR,
        "machine": Prop(max_length=40),
        "bios": Prop(enum=["seabios", "ovmf"]),
        "arch": Prop(enum=["x86_64", "aarch64"]),
        "lock": Prop(enum=LOCKS),
        "migrate_downtime": Prop(type="number", minimum=0),
        "migrate_speed": Prop(type="integer", minimum=0),
        "startup": STR,
        "hotplug": STR,
        "hookscript": STR,
        "smbios1": Prop(max_length=512),
        "vmgenid": STR,
        "meta": STR,
        "args": STR,
        "keyboard": STR,
        "startdate": STR,
        "vmstatestorage": STR,
        "watchdog": STR,
        "rng0": STR,
        "audio0": STR,
        "spice_enhancements": STR,
        "ivshmem": STR,
        "tdf": BOOL,
        **{
            key: BOOL
            for key in (
                "onboot",
                "protection",
                "template",
                "kvm",
                "acpi",
                "tablet",
                "localtime",
                "reboot",
                "freeze",
                "autostart",
            )
        },
    }
    for i in range(32):
        props["net%d" % i] = Prop(format=NET_FORMAT.check("net%d" % i))
        props["ipconfig%d" % i] = Prop(format=IPCONFIG_FORMAT.check("ipconfig%d" % i))
    for key in DRIVE_KEYS:
        props[key] = Prop(format=_drive_format(key))
    for i in range(4):
        props["serial%d" % i] = Prop(pattern=r"(/dev/.+|socket)")
        props["parallel%d" % i] = Prop(pattern=r"/dev/parport\d+|/dev/usb/lp\d+")
    for i in range(16):
        props["hostpci%d" % i] = STR
    for i in range(14):
        props["usb%d" % i] = STR
    for i in range(8):
        props["numa%d" % i] = STR
    for i in range(10):
        props["virtiofs%d" % i] = STR
    for i in range(256):
        props["unused%d" % i] = STR
    return props


CONFIG_PROPS: Dict[str, Prop] = _config_props()

# Options a running VM cannot take at once (no CPU/memory hotplug by default): they wait in [PENDING] until the
# next start, as vmconfig_hotplug_pending leaves them.
COLD_OPTIONS = frozenset(
    _words(
        "cores sockets vcpus memory balloon cpu numa agent machine bios ostype boot bootdisk scsihw vga args "
        "kvm acpi smbios1 vmgenid affinity hugepages arch keyboard localtime tdf tablet watchdog audio0 rng0"
    )
) | frozenset(k for k in CONFIG_PROPS if re.match(r"^(serial|parallel|hostpci|usb|numa|ide|sata)\d+$", k))


def value_type(key: str) -> str:
    prop = CONFIG_PROPS.get(key)
    return prop.type if prop else "string"


def is_drive(key: str) -> bool:
    return key in DRIVE_KEYS
