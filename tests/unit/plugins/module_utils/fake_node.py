"""A fake node for wait_for_node's tests: a VM in its first boot on a fake clock, as ssh, ssh-keyscan and its
guest agent (through fake_pve_api.FakeProxmoxClient.add_guest) see it. No network, no time spent."""

import base64

from ansible_collections.llmgw.fleet.plugins.module_utils import host_keys, node_wait

NAME = "node05"
ADDRESS = "10.77.0.105"
VMID = 1105


def ed25519(fill):
    """An OpenSSH ed25519 public key ('TYPE BASE64') whose 32 key bytes are all ``fill``."""
    blob = b"\0\0\0\x0bssh-ed25519\0\0\0\x20" + bytes([fill]) * 32
    return "ssh-ed25519 " + base64.b64encode(blob).decode()


KEY_IMAGE = ed25519(1)  # the key the template's image had, which cloud-init replaces
KEY_FINAL = ed25519(2)
KEY_OTHER = ed25519(3)

REFUSED_ERR = "ssh: connect to host %s port 22: Connection refused\r\n" % ADDRESS
AUTH_ERR = "debian@%s: Permission denied (publickey).\r\n" % ADDRESS
UNKNOWN_KEY_ERR = ("No ED25519 host key is known for %s and you have requested strict checking.\r\n"
                   "Host key verification failed.\r\n" % NAME)
CHANGED_KEY_ERR = ("@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@\r\n"
                   "@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @\r\n"
                   "Host key verification failed.\r\n")


class Clock:
    """time.monotonic and time.sleep of the wait: time passes only when the waiter sleeps."""

    def __init__(self):
        self.now = 0.0
        self.slept = []

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.slept.append(seconds)
        self.now += seconds


class FakeNode:
    """A VM in its first boot, by the fake clock, as ssh, ssh-keyscan and its guest agent see it.

    Each schedule is [(from second, value)]: ``sshd`` what an ssh connection meets ("refused", "auth": banner but
    the login key is not installed yet, "up"); ``cloud_init`` its status; ``keys`` the host key sshd serves (and
    the agent reads from the file). ``run_command`` is what the waiter runs ssh and ssh-keyscan through; ssh with
    strict checking refuses a key that its known_hosts file does not hold under the HostKeyAlias, as ssh does."""

    def __init__(self, clock, sshd=((0, "up"),), cloud_init=((0, "done"),), keys=((0, KEY_FINAL),), hostname=NAME,
                 agent_from=0, keyscan=True):
        self.clock = clock
        self.sshd = sshd
        self.cloud_init = cloud_init
        self.keys = keys
        self.hostname = hostname
        self.agent_from = agent_from
        self.keyscan = keyscan
        self.commands = []

    def _now(self, schedule):
        return [value for start, value in schedule if start <= self.clock()][-1]

    def key(self):
        return self._now(self.keys)

    def _status(self, argv):
        status = self._now(self.cloud_init)
        out = "status: %s\n" % status
        if "--long" in argv:
            out += "extended_status: %s\nerrors:\n\t- modules-final failed\n" % status
        return (1 if status == "error" else 0), out

    # the guest agent's view (FakeProxmoxClient.add_guest)

    @property
    def agent_running(self):
        return self.clock() >= self.agent_from

    def exec(self, argv):
        assert argv[:2] == ["cloud-init", "status"], argv
        exitcode, out = self._status(argv)
        return {"exitcode": exitcode, "out": out, "err": ""}

    def read_file(self, path):
        assert path == node_wait.HOST_KEY_FILE
        return self.key() + " root@" + NAME + "\n"

    # the network's view

    def run_command(self, argv):
        self.commands.append(argv)
        sshd = self._now(self.sshd)
        if argv[0] == "ssh-keyscan":
            if sshd == "refused" or not self.keyscan:
                return 1, "", "%s: Connection closed by remote host\n" % ADDRESS
            return 0, "# %s:22 SSH-2.0-OpenSSH_9.2p1\n%s %s\n" % (ADDRESS, ADDRESS, self.key()), ""
        assert argv[0] == "ssh", argv
        options = dict(option.split("=", 1) for option in options_of(argv))
        if sshd == "refused":
            return 255, "", REFUSED_ERR
        if options["StrictHostKeyChecking"] == "yes":
            with open(options["UserKnownHostsFile"]) as handle:
                known = host_keys.parse_known_hosts(handle.read()).get(options["HostKeyAlias"], [])
            if not known:
                return 255, "", UNKNOWN_KEY_ERR
            if tuple(self.key().split()) not in known:
                return 255, "", CHANGED_KEY_ERR
        if sshd == "auth":
            return 255, "", AUTH_ERR
        command = argv[-1]
        if command == "hostname":
            return 0, self.hostname + "\n", ""
        if command.startswith("cloud-init status"):
            rc, out = self._status(command.split())
            return rc, out, ""
        raise AssertionError(argv)

    def ssh_commands(self):
        return [argv for argv in self.commands if argv[0] == "ssh"]


def options_of(argv):
    return [argv[i + 1] for i, arg in enumerate(argv) if arg == "-o"]


def strict(argv):
    return "StrictHostKeyChecking=yes" in options_of(argv)
