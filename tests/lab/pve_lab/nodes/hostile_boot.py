"""A lab fault on one container node: a hostile first boot.

On the lab's Debian image cloud-init 22.4 makes the host keys before ssh.service starts and never restarts sshd,
so a node's first boot is gentler than many clouds'. Armed on a VM that exists but does not run, this fault makes
its next boot hostile: ``after_s`` seconds after sshd first answers (``trigger="listening"``), or after it first
answered a client from outside the node (``trigger="client"``: that client has surely seen the first key; with none
within ``CLIENT_WAIT_S`` it goes ahead anyway), the node stops sshd, deletes its host keys, makes new ones, stays
unreachable for ``outage_s`` seconds and starts sshd again. All of that happens while cloud-init is still running
(the unit is ordered before cloud-final), as when cloud-init itself replaces the keys of an image that booted with
some: whoever learns a key before cloud-init has finished learns the wrong one.

It works by writing a oneshot systemd unit into the node's overlay (its ``upper`` directory), which the node
backend mounts at every start, so it needs no change to the running API server; a running node (overlay mounted)
is refused. It acts once: the unit leaves ``DONE_FILE`` behind, and re-arming removes it. Only container nodes
(``cpu: host``) have an overlay; a QEMU guest boots from its own disk image and is not affected.

The node writes what happened to ``LOG_FILE`` (inside the node): ``old SHA256:...`` (the key sshd first served),
``new SHA256:...`` (the one it keeps), and the times (``answered``, ``client``, ``stopped``, ``started``);
``read_log`` parses it from the host.
"""

from __future__ import annotations

import os
from typing import Dict, Optional

from pve_lab.nodes.common import DEFAULT_STATE_DIR, LabError, is_mounted, write_file

UNIT_NAME = "llmgw-lab-hostile-first-boot.service"
UNIT_PATH = "etc/systemd/system/" + UNIT_NAME
WANTS_LINK = "etc/systemd/system/multi-user.target.wants/" + UNIT_NAME
SCRIPT_PATH = "usr/local/sbin/llmgw-lab-hostile-first-boot"
LOG_FILE = "/var/lib/llmgw-lab/hostile-first-boot.log"
DONE_FILE = "/var/lib/llmgw-lab/hostile-first-boot.done"
TRIGGERS = ("listening", "client")
CLIENT_WAIT_S = 120

UNIT = """\
[Unit]
Description=Lab fault: regenerate the ssh host keys and restart sshd after sshd first answered
After=ssh.service
Before=cloud-final.service
ConditionPathExists=!{done}

[Service]
Type=oneshot
Environment=AFTER_S={after_s} OUTAGE_S={outage_s} TRIGGER={trigger} CLIENT_WAIT_S={client_wait_s}
ExecStart=/{script}
TimeoutStartSec=600

[Install]
WantedBy=multi-user.target
"""

SCRIPT = """\
#!/bin/bash
# Lab fault (pve_lab.nodes.hostile_boot): the host keys change after sshd has answered, cloud-init still running.
set -eu
log={log}
mkdir -p "$(dirname "$log")"
fp() {{ ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub | awk '{{print $2}}'; }}
until (exec 3<>/dev/tcp/127.0.0.1/22) 2>/dev/null; do sleep 0.2; done
echo "answered $(date +%s.%N)" >>"$log"
echo "old $(fp)" >>"$log"
if [ "$TRIGGER" = client ]; then
    # sshd logs every client with its address; the first one not from this node itself has seen the old key
    end=$((SECONDS + CLIENT_WAIT_S))
    until journalctl -q -u ssh.service -o cat | grep -E '[0-9]+([.][0-9]+){{3}} port [0-9]+' \\
            | grep -v -e 'Server listening' -e '127[.]0[.]0[.]1' | grep -q .; do
        [ "$SECONDS" -ge "$end" ] && break
        sleep 0.2
    done
    echo "client $(date +%s.%N)" >>"$log"
fi
sleep "$AFTER_S"
systemctl stop ssh.service
echo "stopped $(date +%s.%N)" >>"$log"
rm -f /etc/ssh/ssh_host_*
ssh-keygen -A
sleep "$OUTAGE_S"
systemctl start ssh.service
echo "started $(date +%s.%N)" >>"$log"
echo "new $(fp)" >>"$log"
touch {done}
"""


def upper_dir(vmid: int, state_dir: Optional[str] = None) -> str:
    return os.path.join(os.path.abspath(state_dir or DEFAULT_STATE_DIR), "nodes", str(vmid), "upper")


def _refuse_running(vmid: int, state_dir: Optional[str]) -> None:
    root = os.path.join(os.path.dirname(upper_dir(vmid, state_dir)), "root")
    if is_mounted(root):
        raise LabError("VM %d runs (its overlay is mounted): arm or disarm the hostile first boot while it is "
                       "stopped" % vmid)


def arm(vmid: int, after_s: float = 8.0, outage_s: float = 5.0, trigger: str = "listening",
        state_dir: Optional[str] = None) -> str:
    """Make the next boot of container node ``vmid`` hostile; returns the upper directory written to."""
    if after_s < 0 or outage_s < 0:
        raise LabError("after_s and outage_s are seconds, not negative")
    if trigger not in TRIGGERS:
        raise LabError("trigger is one of %s, not %r" % (", ".join(TRIGGERS), trigger))
    _refuse_running(vmid, state_dir)
    upper = upper_dir(vmid, state_dir)
    write_file(os.path.join(upper, UNIT_PATH),
               UNIT.format(done=DONE_FILE, after_s=after_s, outage_s=outage_s, trigger=trigger,
                           client_wait_s=CLIENT_WAIT_S, script=SCRIPT_PATH))
    write_file(os.path.join(upper, SCRIPT_PATH), SCRIPT.format(log=LOG_FILE, done=DONE_FILE), mode=0o755)
    link = os.path.join(upper, WANTS_LINK)
    os.makedirs(os.path.dirname(link), exist_ok=True)
    if os.path.lexists(link):
        os.remove(link)
    os.symlink("/" + UNIT_PATH, link)
    for stale in (LOG_FILE, DONE_FILE):
        path = os.path.join(upper, stale.lstrip("/"))
        if os.path.lexists(path):
            os.remove(path)
    return upper


def disarm(vmid: int, state_dir: Optional[str] = None) -> None:
    """Remove the fault (idempotent); what it already did to a node stays."""
    _refuse_running(vmid, state_dir)
    upper = upper_dir(vmid, state_dir)
    for path in (WANTS_LINK, UNIT_PATH, SCRIPT_PATH):
        full = os.path.join(upper, path)
        if os.path.lexists(full):
            os.remove(full)


def is_armed(vmid: int, state_dir: Optional[str] = None) -> bool:
    return os.path.lexists(os.path.join(upper_dir(vmid, state_dir), WANTS_LINK))


def read_log(vmid: int, state_dir: Optional[str] = None) -> Dict[str, str]:
    """What the node wrote (keys ``answered``, ``old``, ``stopped``, ``started``, ``new``); empty before it ran.

    Read from the overlay's upper directory, where the node's writes land, so it works whether or not it runs."""
    path = os.path.join(upper_dir(vmid, state_dir), LOG_FILE.lstrip("/"))
    if not os.path.exists(path):
        return {}
    result: Dict[str, str] = {}
    with open(path) as handle:
        for line in handle:
            key, _sep, value = line.strip().partition(" ")
            if key:
                result[key] = value
    return result
