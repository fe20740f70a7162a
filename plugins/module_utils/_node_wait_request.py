# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The wait's vocabulary: its typed errors (:class:`NodeWaitError`: those raised before the wait began; and
:class:`WaitFailed`, with the timeline: those of a wait that ended without a ready node), :class:`WaitRequest`
(the module's parameters) and the ssh and ssh-keyscan command lines built from it.

Private to :mod:`node_wait` (which re-exports the public names); pure: no I/O.
"""

from __future__ import annotations

HOST_KEY_SOURCES = ("auto", "agent", "ssh")


class NodeWaitError(Exception):
    """Base of :mod:`node_wait`'s errors. Raised before the wait began (a bad pinned key, a guest agent that cannot
    be had): no timeline goes with them."""


class BadPinnedKey(NodeWaitError):
    """``pinned_host_key`` is not an OpenSSH public key."""


class AgentUnavailable(NodeWaitError):
    """``host_key_source=agent`` cannot be had: no proxmoxer, no connection options, no agent in the VM's config."""


class VMNotIdentified(AgentUnavailable):
    """No single VM of that name (or VMID) to ask through the guest agent, or the VMID names another VM."""


class WaitFailed(NodeWaitError):
    """The wait began and ended without a ready node; ``timeline`` holds the states seen until then."""

    timeline = None


class NotReady(WaitFailed):
    """``timeout`` ran out; ``last`` is the state seen last (``state``, ``detail``)."""

    def __init__(self, message, last):
        super().__init__(message)
        self.last = last


class CloudInitFailed(WaitFailed):
    """cloud-init finished with an error."""


class AgentRefused(WaitFailed):
    """The guest agent will not answer for good: PVE says it is not configured, or the token may not use it."""


class HostKeyRefused(WaitFailed):
    """The node offers a key other than the one the fleet knows for it."""

    def __init__(self, message, known_fingerprint, offered_fingerprint):
        super().__init__(message)
        self.known_fingerprint = known_fingerprint
        self.offered_fingerprint = offered_fingerprint


class HostKeyUnreadable(WaitFailed):
    """ssh-keyscan read no host key from the node."""


class NotTheNode(WaitFailed):
    """The final strict ssh connection failed, or the node's hostname is not its name."""


class KnownHostsConflict(WaitFailed):
    """Another run changed this node's entry in the fleet's known_hosts while this one waited."""


# --------------------------------------------------------------------------------------------------- request


class WaitRequest:
    """The module's parameters, as the waiter needs them (``address`` without its prefix length)."""

    def __init__(self, name, address, private_key_file, known_hosts_file, user="debian", host_key_source="auto",
                 vmid=None, agent_wait=120, pinned_host_key=None, forget_known_key=False, timeout=300, port=22):
        if host_key_source not in HOST_KEY_SOURCES:
            raise ValueError("host_key_source %r is not one of %s" % (host_key_source, ", ".join(HOST_KEY_SOURCES)))
        self.name = name
        self.address = address.split("/")[0]
        self.private_key_file = private_key_file
        self.known_hosts_file = known_hosts_file
        self.user = user
        self.host_key_source = host_key_source
        self.vmid = vmid
        self.agent_wait = agent_wait
        self.pinned_host_key = pinned_host_key
        self.forget_known_key = forget_known_key
        self.timeout = timeout
        self.port = port


def ssh_argv(request, known_hosts, strict, command):
    """One ssh command to the node, its key filed under the node's name; never prompts."""
    options = ["BatchMode=yes", "ConnectTimeout=5", "LogLevel=ERROR", "HostKeyAlias=" + request.name,
               "UserKnownHostsFile=" + known_hosts,
               "StrictHostKeyChecking=" + ("yes" if strict else "no")]
    argv = ["ssh", "-p", str(request.port), "-i", request.private_key_file]
    for option in options:
        argv += ["-o", option]
    return argv + ["{}@{}".format(request.user, request.address), command]


def keyscan_argv(request):
    return ["ssh-keyscan", "-T", "5", "-t", "ed25519", "-p", str(request.port), request.address]
