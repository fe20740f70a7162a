# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Check a launch command's flags against an engine's own ``--help`` text. Pure: text in, findings out.

Matching is on whole flags: ``--port`` is not satisfied by ``--port-range`` and ``-c`` not by ``-cb``. A flag
counts as offered when the help defines it (it appears in the option column of a line that starts with a dash);
a flag that only appears inside some description (``deprecated, use --load-mode``) is reported as mentioned,
not offered.
"""

from __future__ import annotations

import re

# A flag token: one or two dashes, a letter, then letters, digits, '-', '_' or '.'; whole-token only.
_FLAG = r"--?[A-Za-z][A-Za-z0-9_.-]*(?<![.-])"
_FLAG_RE = re.compile(r"(?<![\w-])(%s)(?![\w-])" % _FLAG)
_MAX_OPTION_INDENT = 8
# Lines a truncating pipe (head -n, a fixed buffer) tends to stop at.
_ROUND_LINE_COUNTS = frozenset((50, 100, 200, 250, 300, 400, 500, 600, 800, 1000, 1024, 2000, 4096))


def _option_column(line):
    """The part of an option definition line that names options (before its description), or None."""
    stripped = line.lstrip()
    # Option lines start at the margin (llama.cpp) or a little in (argparse); wrapped descriptions start far in.
    if len(line) - len(stripped) > _MAX_OPTION_INDENT or not re.match(_FLAG, stripped):
        return None
    column = []
    # Tokens: a flag (maybe with =VALUE), a metavar (N, FNAME, HOST:PORT, {a,b}, <0|1>, [X ...]) or a separator.
    for token in re.split(r"(\s+)", stripped):
        if not token or token.isspace():
            continue
        bare = token.rstrip(",")
        if re.match(_FLAG, bare) or _is_metavar(bare):
            column.append(bare)
            continue
        break
    return " ".join(column)


def _is_metavar(token):
    if token and token[0] in "{[<(" or token in ("...", "|"):
        return True
    if token and token[-1] in "}]>)":
        return True
    return bool(re.match(r"^[A-Z0-9_:|,.=-]+$", token))


def parse_help(text, normalize_underscores=False):
    """(offered, mentioned): flags the help defines, and every flag token anywhere in it.

    ``normalize_underscores``: vLLM treats ``--max_model_len`` and ``--max-model-len`` as the same flag; with
    this set, every flag is stored with ``_`` turned into ``-``.
    """
    offered, mentioned = set(), set()
    for line in (text or "").splitlines():
        column = _option_column(line)
        if column:
            offered.update(_FLAG_RE.findall(column))
        mentioned.update(_FLAG_RE.findall(line))
    if normalize_underscores:
        offered = {normalize(f) for f in offered}
        mentioned = {normalize(f) for f in mentioned}
    return frozenset(offered), frozenset(mentioned)


def normalize(flag):
    """``--max_model_len`` -> ``--max-model-len`` (the dashes that start a flag stay as they are)."""
    body = flag.lstrip("-")
    return flag[: len(flag) - len(body)] + body.replace("_", "-")


def flags_of_argv(argv):
    """The flags a command line passes: ``--port`` from ``--port 8080`` or ``--port=8080``; not ``-1``."""
    found = []
    for arg in argv[1:]:
        if not isinstance(arg, str) or not arg.startswith("-"):
            continue
        name = arg.split("=", 1)[0]
        if re.match(r"^%s$" % _FLAG, name) and name not in found:
            found.append(name)
    return found


def check_flags(wanted, help_text, normalize_underscores=False):
    """Each wanted flag checked against the help: a list of {flag, status} with status offered/mentioned/missing."""
    offered, mentioned = parse_help(help_text, normalize_underscores)
    results = []
    for flag in wanted:
        key = normalize(flag) if normalize_underscores else flag
        if key in offered:
            status = "offered"
        elif key in mentioned:
            status = "mentioned"
        else:
            status = "missing"
        results.append({"flag": flag, "status": status})
    return results


def truncation_warnings(help_text, expected_lines=None, last_marker=None):
    """Reasons to think the help text was cut short; an empty list when it looks whole.

    ``expected_lines``: how many lines this engine version's help has (from its flag table);
    ``last_marker``: a string the last part of a whole help text contains.
    """
    text = help_text or ""
    lines = text.splitlines()
    count = len(lines)
    reasons = []
    if not text.strip():
        return ["the help text is empty"]
    if expected_lines and count < expected_lines * 0.9:
        reasons.append("the help text has %d lines; this engine version prints about %d" % (count, expected_lines))
    if last_marker and last_marker not in "\n".join(lines[-40:]):
        reasons.append("the help text does not end the way this engine's help ends (%r not found near the end)"
                       % last_marker)
    if count in _ROUND_LINE_COUNTS:
        reasons.append("the help text is exactly %d lines, a count a truncating pipe stops at" % count)
    if lines and _option_column(lines[-1]) and not text.endswith("\n"):
        reasons.append("the help text stops in the middle of an option line")
    return reasons
