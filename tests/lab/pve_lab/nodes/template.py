"""The one Debian 12 root every node boots from, built once with debootstrap and cached.

The same root serves both kinds of node: a container boots it through an overlay, a QEMU guest boots the cloud
kernel that is installed in it, directly, from an ext4 image of it. The mirror's packages are fetched by the
template's own apt while it still points at Debian, so their versions fit the root exactly.
"""

from __future__ import annotations

import fcntl
import glob
import json
import os
import shutil
import subprocess
import time
from typing import Dict, Optional, Sequence

from pve_lab.nodes import mirror
from pve_lab.nodes.common import CACHE_DIR, LOG, MIRROR_URL, LabError, lab_processes, mounts, run, write_file

SUITE = "bookworm"
DEBIAN_URL = "http://deb.debian.org/debian"

# debootstrap does not resolve virtual packages, hence python3-cffi-backend; libgomp1 is deliberately absent
# (nodes install it from the lab's mirror, which is what onboarding has to do on a real fleet).
BASE_PACKAGES = (
    "systemd", "systemd-sysv", "dbus", "openssh-server", "iproute2", "python3", "cloud-init",
    "python3-cffi-backend", "ca-certificates",
)
NODE_PACKAGES = (
    "qemu-guest-agent",  # the agent PVE's agent/* endpoints talk to
    "sudo",  # cloud-init's default user gets NOPASSWD sudo, as on a cloud image
    "udev",  # a QEMU guest needs it for its devices (the agent's virtio port); nspawn skips it
    "kmod",
    "e2fsprogs",  # cloud-init's resizefs grows the guest's root after boot
    "procps",
    "linux-image-cloud-amd64",  # booted by QEMU guests only
)
MIRROR_PACKAGES = ("libgomp1",)

RECIPE_VERSION = 1
DISK_SIZE = "8G"

# A container has no virtio-serial port, so the agent listens on a socket the host reaches through /proc.
CONTAINER_AGENT_UNIT = """\
[Unit]
Description=QEMU Guest Agent on a unix socket (lab container nodes have no virtio-serial port)
ConditionVirtualization=container
After=local-fs.target

[Service]
ExecStart=/usr/sbin/qemu-ga --method=unix-listen --path=/run/qemu-ga.sock
Restart=always

[Install]
WantedBy=multi-user.target
"""
CONTAINER_AGENT_SOCKET = "/run/qemu-ga.sock"

# Only NoCloud is offered, as on a PVE guest; None lets cloud-init finish cleanly when no seed is found.
DATASOURCE_CFG = "datasource_list: [ NoCloud, None ]\n"


def recipe(mirror_packages: Sequence[str]) -> Dict[str, object]:
    return {
        "version": RECIPE_VERSION,
        "suite": SUITE,
        "packages": list(BASE_PACKAGES + NODE_PACKAGES),
        "mirror_packages": sorted(mirror_packages),
        "disk_size": DISK_SIZE,
    }


class Template:
    """Paths of the cached template and the build that makes them."""

    def __init__(self, cache_dir: str = CACHE_DIR, mirror_packages: Sequence[str] = MIRROR_PACKAGES):
        self.cache_dir = cache_dir
        self.dir = os.path.join(cache_dir, "template")
        self.rootfs = os.path.join(self.dir, "rootfs")
        self.kernel = os.path.join(self.dir, "boot", "vmlinuz")
        self.initrd = os.path.join(self.dir, "boot", "initrd.img")
        self.disk = os.path.join(self.dir, "disk.raw")
        self.mirror_dir = os.path.join(self.dir, "mirror")
        self.stamp = os.path.join(self.dir, "recipe.json")
        self.mirror_packages = tuple(mirror_packages)
        self.last_build_seconds: Optional[float] = None

    def is_current(self) -> bool:
        try:
            with open(self.stamp) as handle:
                return json.load(handle) == recipe(self.mirror_packages)
        except (OSError, ValueError):
            return False

    def ensure(self) -> bool:
        """Build the template unless the cached one matches the recipe; True when it built."""
        if self.is_current():
            return False
        os.makedirs(self.cache_dir, exist_ok=True)
        with open(os.path.join(self.cache_dir, "template.lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building it right now
            if self.is_current():
                return False
            return self._build()

    def _build(self) -> bool:
        in_use = [m["target"] for m in mounts() if self.rootfs in m.get("options", "")]
        if in_use or lab_processes(role="qemu"):
            raise LabError("the node template must be rebuilt (its recipe changed) but nodes still use it: "
                           "stop them first (lab down)")
        started = time.monotonic()
        build_dir = self.dir + ".build"
        _remove_tree(build_dir)
        os.makedirs(build_dir)
        rootfs = os.path.join(build_dir, "rootfs")
        _debootstrap(rootfs, os.path.join(build_dir, "debootstrap.log"))
        _fetch_mirror_packages(rootfs, os.path.join(build_dir, "mirror"), self.mirror_packages)
        _configure_root(rootfs)
        _export_boot_files(rootfs, os.path.join(build_dir, "boot"))
        mirror.write_index(os.path.join(build_dir, "mirror"))
        _make_disk(rootfs, os.path.join(build_dir, "disk.raw"))
        with open(os.path.join(build_dir, "recipe.json"), "w") as handle:
            json.dump(recipe(self.mirror_packages), handle, indent=1)
        _remove_tree(self.dir)
        os.replace(build_dir, self.dir)
        self.last_build_seconds = time.monotonic() - started
        LOG.info("template built in %.1f s", self.last_build_seconds)
        return True


def _remove_tree(path: str) -> None:
    if os.path.lexists(path):
        shutil.rmtree(path)


def _chroot(rootfs: str, *argv: str, timeout: float = 900) -> None:
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "DEBIAN_FRONTEND": "noninteractive", "LANG": "C.UTF-8"}
    run(["chroot", rootfs] + list(argv), env=env, timeout=timeout)


def _debootstrap(rootfs: str, log_path: str) -> None:
    include = ",".join(BASE_PACKAGES + NODE_PACKAGES)
    argv = ["debootstrap", "--variant=minbase", "--include=" + include, SUITE, rootfs, DEBIAN_URL]
    LOG.info("debootstrap into %s", rootfs)
    with open(log_path, "w") as log:
        proc = subprocess.run(argv, stdout=log, stderr=log, timeout=1800, check=False)
    if proc.returncode != 0:
        with open(log_path) as log:
            tail = log.read()[-3000:]
        raise LabError("debootstrap failed (%d), log %s:\n%s" % (proc.returncode, log_path, tail))


def _fetch_mirror_packages(rootfs: str, mirror_dir: str, packages: Sequence[str]) -> None:
    """Download the packages and whatever they need that the template lacks, with the template's own apt."""
    os.makedirs(mirror_dir, exist_ok=True)
    _chroot(rootfs, "apt-get", "clean")  # debootstrap leaves the packages it installed there
    _chroot(rootfs, "apt-get", "update")
    _chroot(rootfs, "apt-get", "install", "--download-only", "--no-install-recommends", "-y", *packages)
    debs = glob.glob(os.path.join(rootfs, "var/cache/apt/archives/*.deb"))
    if not debs:
        raise LabError("apt fetched nothing for the mirror (%s)" % " ".join(packages))
    for deb in debs:
        shutil.move(deb, os.path.join(mirror_dir, os.path.basename(deb)))
    _chroot(rootfs, "apt-get", "clean")
    for path in glob.glob(os.path.join(rootfs, "var/lib/apt/lists/*")):
        if os.path.isfile(path):
            os.remove(path)


def _configure_root(rootfs: str) -> None:
    def path(rel: str) -> str:
        return os.path.join(rootfs, rel.lstrip("/"))

    write_file(path("/etc/apt/sources.list"), "deb [trusted=yes] %s ./\n" % MIRROR_URL)
    # Keys made when openssh-server was installed would be shared by every node: cloud-init makes each node
    # its own on first boot, and without them sshd cannot start, so a node never serves a template key.
    for key in glob.glob(path("/etc/ssh/ssh_host_*")):
        os.remove(key)
    write_file(path("/etc/machine-id"), "")
    if os.path.lexists(path("/var/lib/dbus/machine-id")):
        os.remove(path("/var/lib/dbus/machine-id"))
    write_file(path("/etc/hostname"), "debian\n")
    write_file(path("/etc/hosts"), "127.0.0.1\tlocalhost\n::1\t\tlocalhost ip6-localhost ip6-loopback\n")
    if os.path.lexists(path("/etc/resolv.conf")):
        os.remove(path("/etc/resolv.conf"))
    write_file(path("/etc/resolv.conf"), "# the lab's nodes resolve nothing outside\n")
    write_file(path("/etc/fstab"), "# root is given on the kernel command line (QEMU) or by systemd-nspawn\n")
    write_file(path("/etc/cloud/cloud.cfg.d/90_dpkg.cfg"), DATASOURCE_CFG)
    write_file(path("/etc/systemd/system/qemu-guest-agent-container.service"), CONTAINER_AGENT_UNIT)
    _chroot(rootfs, "systemctl", "enable", "qemu-guest-agent-container.service", "systemd-networkd.service")


def _export_boot_files(rootfs: str, boot_dir: str) -> None:
    kernels = sorted(glob.glob(os.path.join(rootfs, "boot/vmlinuz-*")))
    initrds = sorted(glob.glob(os.path.join(rootfs, "boot/initrd.img-*")))
    if not kernels or not initrds:
        raise LabError("the template has no kernel or initrd under /boot")
    os.makedirs(boot_dir, exist_ok=True)
    shutil.copy(kernels[-1], os.path.join(boot_dir, "vmlinuz"))
    shutil.copy(initrds[-1], os.path.join(boot_dir, "initrd.img"))


def _make_disk(rootfs: str, disk: str) -> None:
    run(["truncate", "-s", DISK_SIZE, disk])
    run(["mkfs.ext4", "-q", "-F", "-L", "root", "-d", rootfs, disk], timeout=900)
