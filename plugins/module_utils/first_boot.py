# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Reading a new VM's first boot from the outside: what one ssh attempt saw, and whether the node is ready.

cloud-init regenerates host keys and restarts sshd during a VM's first minute, so refused connections, resets
and failed logins are expected on the way to ready; each attempt is classified so that a timeout can say what
it saw last instead of "failed".
"""

from __future__ import annotations

NO_ROUTE = "no route to the node"
REFUSED = "connection refused (sshd not listening yet, or restarting)"
TIMED_OUT = "connection timed out"
RESET = "connection closed during the handshake (sshd restarting)"
AUTH_FAILED = "ssh banner but authentication failed (the key from sshkeys is not installed yet, or is wrong)"
CLOUD_INIT_RUNNING = "ssh works, cloud-init still running"
CLOUD_INIT_ERROR = "cloud-init finished with an error"
READY = "ssh works and cloud-init is done"
UNKNOWN = "unexpected ssh failure"
KEY_CHANGED = "ssh banner but the node offers a host key other than the one read through the hypervisor"
VM_NOT_RUNNING = "the VM is not running (seen through the hypervisor)"
AGENT_NOT_ANSWERING = "the guest agent does not answer yet (the VM is booting, or qemu-guest-agent is missing)"
AGENT_CLOUD_INIT_RUNNING = "cloud-init still running (seen through the guest agent)"
AGENT_READY = "cloud-init is done (seen through the guest agent)"
AGENT_FAILED = "the guest agent call failed"

_SSH_ERRORS = (
    ("REMOTE HOST IDENTIFICATION HAS CHANGED", KEY_CHANGED),
    ("Host key verification failed", KEY_CHANGED),
    ("No route to host", NO_ROUTE),
    ("Network is unreachable", NO_ROUTE),
    ("Connection refused", REFUSED),
    ("timed out", TIMED_OUT),
    ("Permission denied", AUTH_FAILED),
    ("kex_exchange_identification", RESET),
    ("Connection reset", RESET),
    ("Connection closed", RESET),
    ("closed by remote host", RESET),
)


def classify(rc, stdout, stderr):
    """One attempt of `ssh ... cloud-init status`: which stage of the first boot it shows."""
    if rc == 255:
        for needle, state in _SSH_ERRORS:
            if needle in stderr:
                return state
        return UNKNOWN
    status = ""
    for line in stdout.splitlines():
        if line.strip().startswith("status:"):
            status = line.split(":", 1)[1].strip()
    if status == "done":
        return READY
    if status in ("running", "not run", "not started"):
        return CLOUD_INIT_RUNNING
    if status in ("error", "degraded done", "degraded"):
        return CLOUD_INIT_ERROR
    return UNKNOWN


def detail(state, rc, stdout, stderr):
    """What the timeline keeps of one ssh attempt: its stderr for an ssh failure, its stdout for an answer; for an
    attempt nothing above recognises, its exit status and both (they may be the only clue to it)."""
    if state == UNKNOWN:
        out = (stdout or "").strip()[-300:] or "(none)"
        err = (stderr or "").strip()[-300:] or "(none)"
        return "exit %s; stdout: %s; stderr: %s" % (rc, out, err)
    return stderr if rc == 255 else stdout


def classify_agent_status(exitcode, stdout):
    """`cloud-init status` run through the guest agent: AGENT_READY, AGENT_CLOUD_INIT_RUNNING, CLOUD_INIT_ERROR
    or UNKNOWN (the agent has no ssh stage, so only the status line counts)."""
    state = classify(exitcode if exitcode != 255 else 1, stdout, "")
    return {READY: AGENT_READY, CLOUD_INIT_RUNNING: AGENT_CLOUD_INIT_RUNNING}.get(state, state)


def timeout_message(name, address, timeout, last):
    """What a wait that ran out says: the node, how long, and the last state seen (with its detail)."""
    detail = " ({})".format(last["detail"]) if last.get("detail") else ""
    return "{} ({}) was not ready after {} s; last seen: {}{}".format(name, address, timeout, last["state"], detail)


class Timeline:
    """The distinct states seen, in order, with the seconds at which each began."""

    def __init__(self):
        self.events = []

    def record(self, seconds, state, detail=""):
        if not self.events or self.events[-1]["state"] != state:
            self.events.append({"after_s": round(seconds, 1), "state": state, "detail": detail.strip()[-300:]})

    @property
    def last(self):
        return self.events[-1] if self.events else {"state": "nothing tried", "detail": ""}
