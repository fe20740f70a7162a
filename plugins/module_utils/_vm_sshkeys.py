# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The ``sshkeys`` value: user input normalized, PVE's URL encoding undone and done, and keys compared by type
and blob (a comment or options do not make another key).

Private to :mod:`vm_plan` (which re-exports the public names); pure: no I/O.
"""

from __future__ import annotations

from urllib.parse import quote, unquote


def key_lines(keys):
    """The key lines of user input (a multi-line string or a list of lines): stripped, no blanks, no comments."""
    if isinstance(keys, (list, tuple)):
        keys = "\n".join(str(k) for k in keys)
    for line in str(keys or "").splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            yield line


def key_fields(line):
    """(type, blob) of a key line, past any options; None when no key type is followed by a blob."""
    fields = line.split()
    for index, field in enumerate(fields):
        if field.startswith(("ssh-", "ecdsa-", "sk-")) and index + 1 < len(fields):
            return (field, fields[index + 1])
    return None


def _key_identity(line):
    """A key is its type and blob; the comment and options do not make it another key."""
    return key_fields(line) or (line,)


def normalize_sshkeys(keys):
    """User input (a multi-line string or a list of lines) -> the text to store, one key per line."""
    if keys is None:
        return None
    lines = list(key_lines(keys))
    return "\n".join(lines) + "\n" if lines else ""


def decode_sshkeys(value):
    """The ``sshkeys`` value as PVE stores it (URL-encoded) -> the decoded text."""
    return unquote(str(value or ""))


def encode_sshkeys(text):
    """Text -> the URL-encoded form PVE requires (``+`` for space is refused, hence ``safe=''``)."""
    return quote(text, safe="")


def sshkey_set(text):
    """The set of keys (type, blob) in decoded text."""
    return frozenset(_key_identity(line) for line in key_lines(text))
