# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fleet's known_hosts file as the wait reads and writes it: read, with this node's entry forgotten where
asked; predicted in check mode; and this node's settled entry recorded under an exclusive lock, keeping the
entries other runs wrote meanwhile (:class:`KnownHostsConflict` when this node's own entry changed).

Private to :mod:`node_wait` (which re-exports the public names); does I/O: the known_hosts file, its ``.lock``
file (flock) and the temporary file it is written through.
"""

from __future__ import annotations

import fcntl
import os

from ansible_collections.llmgw.fleet.plugins.module_utils import host_keys
from ansible_collections.llmgw.fleet.plugins.module_utils._node_wait_request import KnownHostsConflict


def read_text(path):
    if not os.path.exists(path):
        return ""
    with open(path) as handle:
        return handle.read()


def known_before_wait(request):
    """(the fleet's file as read, the entries the wait starts from: without this node's after forget_known_key)."""
    original = read_text(request.known_hosts_file)
    known = host_keys.remove_entries(original, request.name) if request.forget_known_key else original
    return original, known


def predict(request):
    """Check mode: from the known_hosts file alone, whether a key would be learned."""
    known = known_before_wait(request)[1]
    # After forgetting, the key is learned again: the file changes unless the very same key comes back.
    action = host_keys.KEEP if request.name in host_keys.parse_known_hosts(known) else host_keys.LEARN
    return dict(changed=action == host_keys.LEARN, host_key_action=action, timeline=[])


def write_text(path, text, atomic_move):
    os.makedirs(os.path.dirname(os.path.abspath(path)), mode=0o700, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as handle:
        handle.write(text)
    os.chmod(tmp, 0o600)
    atomic_move(tmp, path)
    os.chmod(path, 0o600)  # Ansible's atomic_move gives a new file the umask's mode (0644)


def record_key(name, path, known_text, settled, atomic_move=os.replace):
    """Write this node's settled entry into the fleet's file; True when the file changed.

    Several nodes may be added at once, each run writing the same file: under an exclusive lock the file is read
    again and only this node's lines are taken from ``settled``, so an entry another run wrote meanwhile is kept.
    KnownHostsConflict when this node's own entry changed meanwhile."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), mode=0o700, exist_ok=True)
    with open(path + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        current = read_text(path)
        if current != known_text:
            if host_keys.parse_known_hosts(current).get(name) != host_keys.parse_known_hosts(known_text).get(name):
                raise KnownHostsConflict("{}: its entry in {} was changed by another run while this one waited; run "
                                         "again to settle it".format(name, path))
            others = host_keys.remove_entries(current, name)
            if others and not others.endswith("\n"):
                others += "\n"
            mine = [line for line in settled.splitlines(True) if line.split()[:1] == [name]]
            settled = others + "".join(mine)
        if settled == current:
            return False
        write_text(path, settled, atomic_move)
        return True
