# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""No Python file under plugins/ over 300 lines of code, so each stays readable as one job.

Lines of code: lines that are not blank, not comments, not docstrings and not a module's DOCUMENTATION, EXAMPLES
or RETURN text (those are documentation, whatever their length).
"""

import ast
import os

import pytest

from ansible_collections.llmgw.fleet.plugins.module_utils import placement

PLUGINS = os.path.dirname(os.path.dirname(os.path.abspath(placement.__file__)))
LIMIT = 300
DOC_STRINGS = ("DOCUMENTATION", "EXAMPLES", "RETURN")


def _python_files():
    for root, _dirs, files in os.walk(PLUGINS):
        for name in sorted(files):
            if name.endswith(".py"):
                yield os.path.relpath(os.path.join(root, name), PLUGINS)


def _is_text(node):
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def _documentation_lines(tree):
    lines = set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.Assign) and _is_text(node.value)
                and any(getattr(target, "id", None) in DOC_STRINGS for target in node.targets)):
            lines.update(range(node.lineno, node.end_lineno + 1))
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and _is_text(first.value):
                lines.update(range(first.lineno, first.end_lineno + 1))
    return lines


def code_lines(source):
    skip = _documentation_lines(ast.parse(source))
    return sum(1 for number, line in enumerate(source.splitlines(), 1)
               if number not in skip and line.strip() and not line.strip().startswith("#"))


def test_the_measure_counts_code_and_leaves_out_documentation():
    source = ('"""Doc\n\nmore."""\n\nDOCUMENTATION = """\nlong\n"""\n\n# a comment\n\n\n'
              'def f():\n    """Doc."""\n    return 1\n')
    assert code_lines(source) == 2


@pytest.mark.parametrize("path", list(_python_files()))
def test_no_file_is_over_300_lines_of_code(path):
    with open(os.path.join(PLUGINS, path)) as handle:
        count = code_lines(handle.read())
    assert count <= LIMIT, "plugins/%s has %d lines of code (limit %d): split it by job" % (path, count, LIMIT)
