# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Typed errors of the Proxmox client, and the mapping from the shapes in which PVE reports them.

PVE puts its error text in the HTTP reason phrase (proxmoxer hands it over as ``content``), parameter errors
come as 400 "Parameter verification failed." with an ``errors`` dict, and many conditions that are not server
faults (a missing VM, an existing VMID, a lock) arrive as 500 with a telling text. ``classify`` turns those
into the classes below so that callers branch on types, never on strings.
"""

from __future__ import annotations

import re


class ProxmoxError(Exception):
    """Base of every error the client raises. ``status`` is the HTTP status where there was one."""

    def __init__(self, message, status=None, reason=None, errors=None):
        super().__init__(message)
        self.message = message
        self.status = status
        self.reason = reason
        self.errors = errors or {}


class ConnectionFailed(ProxmoxError):
    """The API could not be reached (refused, no route, DNS, TLS handshake)."""


class TLSVerificationFailed(ConnectionFailed):
    """The server certificate did not verify against the CA bundle in use."""


class AuthError(ProxmoxError):
    """Authentication failed or the ticket/token is not accepted (401)."""


class PermissionDenied(ProxmoxError):
    """Authenticated, but the user or token lacks a privilege (403). ``acl_path`` and ``privileges`` are what
    PVE named ("Permission check failed (PATH, A|B)"), where it named them."""

    def __init__(self, message, status=None, reason=None, errors=None, acl_path=None, privileges=()):
        super().__init__(message, status=status, reason=reason, errors=errors)
        self.acl_path = acl_path
        self.privileges = tuple(privileges)


class NotFound(ProxmoxError):
    """The VM, node, task or API path does not exist."""


class AlreadyExists(ProxmoxError):
    """The VMID (or another unique thing) is taken."""


class Locked(ProxmoxError):
    """The VM is locked by another operation, or its config lock could not be taken."""


class ConfigChanged(ProxmoxError):
    """The config digest sent with a change no longer matches: someone else changed the VM meanwhile."""


class ParameterError(ProxmoxError):
    """PVE refused a parameter (400 with an ``errors`` dict, one message per parameter)."""


class TaskFailed(ProxmoxError):
    """A task ended with an exit status other than ``OK`` or ``WARNINGS: N``."""

    def __init__(self, message, upid=None, exitstatus=None, log_tail=None):
        super().__init__(message)
        self.upid = upid
        self.exitstatus = exitstatus
        self.log_tail = list(log_tail or [])


class Timeout(ProxmoxError):
    """A wait (task, lock, HTTP request) ran past its limit. ``what`` says what was being waited for."""

    def __init__(self, message, what=None, upid=None, log_tail=None):
        super().__init__(message)
        self.what = what
        self.upid = upid
        self.log_tail = list(log_tail or [])


_NOT_FOUND = re.compile(
    r"does not exist|no such (?:vm|cluster node|task|resource)|not found|hostname lookup '[^']*' failed|"
    r"Method '[^']*' not implemented",
    re.IGNORECASE,
)
_ALREADY_EXISTS = re.compile(r"already exists", re.IGNORECASE)
_LOCKED = re.compile(r"\bis locked\b|can't lock file|got lock request timeout", re.IGNORECASE)
# qemu-server's update_vm_api says "checksum missmatch (file change by other user?)" (sic); pve-common's
# assert_if_modified, used elsewhere, "detected modified configuration - file changed by other user? Try again."
_CONFIG_CHANGED = re.compile(
    r"checksum mis+match|detected modified configuration|file changed? by other user", re.IGNORECASE
)


def _errors_text(errors):
    if not isinstance(errors, dict):
        return str(errors) if errors else ""
    return "; ".join("%s: %s" % (key, str(value).strip()) for key, value in sorted(errors.items()))


def classify(status, reason, errors=None):
    """Return the typed error for an HTTP answer from PVE.

    ``status`` is the HTTP status, ``reason`` the reason phrase (PVE's message), ``errors`` the body's
    ``errors`` dict if any. The message keeps PVE's own words and appends the per-parameter errors.
    """
    reason = (reason or "").strip()
    errors = errors if isinstance(errors, dict) else ({} if not errors else {"_": errors})
    detail = _errors_text(errors)
    message = reason if not detail else "%s (%s)" % (reason, detail) if reason else detail
    message = "HTTP %s: %s" % (status, message) if message else "HTTP %s" % status
    # The text decides first: PVE reports a taken VMID both as 500 and as 400 errors.vmid.
    haystack = " ".join([reason, detail])
    if status == 401:
        cls = AuthError
    elif status == 403:
        cls = PermissionDenied
    elif _CONFIG_CHANGED.search(haystack):
        cls = ConfigChanged
    elif _LOCKED.search(haystack):
        cls = Locked
    elif _ALREADY_EXISTS.search(haystack):
        cls = AlreadyExists
    elif status in (404, 501) or _NOT_FOUND.search(haystack):
        cls = NotFound
    elif status == 400:
        cls = ParameterError
    elif status in (595, 596):
        cls = ConnectionFailed
    else:
        cls = ProxmoxError
    if cls is PermissionDenied:
        return _permission_denied(message, status, reason, errors)
    return cls(message, status=status, reason=reason, errors=errors)


_PERMISSION_CHECK = re.compile(r"Permission check failed \((/[^,)]*), ([^)]+)\)")


def _permission_denied(message, status, reason, errors):
    """PVE's 403, with what to grant where it names the privilege."""
    match = _PERMISSION_CHECK.search(reason or "")
    if not match:
        return PermissionDenied(message, status=status, reason=reason, errors=errors)
    path, privileges = match.group(1), tuple(match.group(2).split("|"))
    message = ("%s; the API token (or user) lacks %s on %s: grant it (docs/real-proxmox.md, step 3: the LLMGWFleet "
               "role), then run again" % (message, " or ".join(privileges), path))
    return PermissionDenied(message, status=status, reason=reason, errors=errors, acl_path=path,
                            privileges=privileges)


class AgentNotConfigured(ProxmoxError):
    """The VM's config does not enable the QEMU guest agent (``agent: 1``)."""


class VMNotRunning(ProxmoxError):
    """The VM is not running, so its guest agent cannot answer."""


class AgentNotRunning(ProxmoxError):
    """The agent is configured and the VM runs, but the agent does not answer (still booting, or not installed)."""


_AGENT_ERRORS = (
    (re.compile(r"No QEMU guest agent configured", re.IGNORECASE), AgentNotConfigured),
    (re.compile(r"\bVM \d+ (?:is )?not running\b", re.IGNORECASE), VMNotRunning),
    (re.compile(r"guest agent is not running|QEMU guest agent .*not (?:running|available)", re.IGNORECASE),
     AgentNotRunning),
)


def classify_agent(error):
    """The agent-specific type for an error of an ``agent/*`` call (PVE reports all of them as HTTP 500)."""
    haystack = " ".join([error.reason or "", error.message or ""])
    for pattern, cls in _AGENT_ERRORS:
        if pattern.search(haystack):
            return cls(error.message, status=error.status, reason=error.reason, errors=error.errors)
    return error
