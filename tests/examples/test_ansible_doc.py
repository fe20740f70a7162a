"""`ansible-doc llmgw.fleet.<each plugin>` (and each role) renders completely."""

import os
import textwrap

import published
import pytest
import rendered

ITEMS = rendered.documented()


@pytest.fixture(scope="module")
def pages():
    return rendered.render(ITEMS)


@pytest.mark.parametrize("kind, name, path", ITEMS, ids=["{}:{}".format(k, n) for k, n, _p in ITEMS])
def test_ansible_doc_renders(pages, kind, name, path):
    problems = pages[path]
    assert not problems, "{}: {}".format(os.path.relpath(path, published.REPO), "; ".join(problems))


def test_every_kind_of_plugin_is_rendered():
    kinds = {kind for kind, _name, _path in ITEMS}
    assert {"module", "lookup", "inventory", "filter", "role"} <= kinds, kinds


BROKEN_DOC = '''
DOCUMENTATION = r"""
module: broken
short_description: A fixture whose documentation does not parse
description: [a list: that is not closed
"""
EXAMPLES = ""
RETURN = ""
'''

NO_RETURN = '''
DOCUMENTATION = r"""
module: no_return
short_description: A fixture without return values
description: A fixture.
author: llmgw.fleet developers
options:
  name:
    description: A name.
    type: str
"""
EXAMPLES = r"""
- name: Run it
  fixture.docs.no_return:
    name: x
"""
RETURN = ""
'''


def test_a_plugin_that_does_not_render_is_named(tmp_path):
    """The check can fail: a collection with a broken module and one without return values."""
    modules = tmp_path / "ansible_collections" / "fixture" / "docs" / "plugins" / "modules"
    modules.mkdir(parents=True)
    (modules.parent.parent / "galaxy.yml").write_text("namespace: fixture\nname: docs\nversion: 1.0.0\n")
    (modules / "broken.py").write_text(textwrap.dedent(BROKEN_DOC))
    (modules / "no_return.py").write_text(textwrap.dedent(NO_RETURN))
    items = [("module", "broken", str(modules / "broken.py")), ("module", "no_return", str(modules / "no_return.py"))]
    problems = rendered.render(items, namespace="fixture.docs", collections_path=str(tmp_path))
    assert any("fixture.docs.broken exited 1" in p for p in problems[str(modules / "broken.py")]), problems
    assert problems[str(modules / "no_return.py")] == [
        "ansible-doc -t module fixture.docs.no_return: the page has no RETURN VALUES:"], problems
