"""Every published example is loaded by this test; an example nobody loaded is a guess."""

import os

import published
import pytest

FILES = published.published_files()
DOCUMENTED = published.documented_modules()
FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")


def ids(paths):
    return [os.path.relpath(p, published.REPO) for p in paths]


def assert_clean(problems):
    assert not problems, "broken published examples:\n" + "\n".join(map(str, problems))


@pytest.mark.parametrize("path", FILES["plugins"], ids=ids(FILES["plugins"]))
def test_plugin_documentation_and_examples(path):
    assert_clean(published.check_plugin_file(path, DOCUMENTED))


@pytest.mark.parametrize("path", FILES["markdown"], ids=ids(FILES["markdown"]))
def test_markdown_snippets(path):
    assert_clean(published.check_markdown_file(path, DOCUMENTED))


@pytest.mark.parametrize("path", FILES["markdown"], ids=ids(FILES["markdown"]))
def test_markdown_links_and_named_paths_exist(path):
    assert_clean(published.check_markdown_links(path))


@pytest.mark.parametrize("path", FILES["playbooks"], ids=ids(FILES["playbooks"]))
def test_playbooks(path):
    assert_clean(published.check_playbook(path, DOCUMENTED))


@pytest.mark.parametrize("path", FILES["inventories"], ids=ids(FILES["inventories"]))
def test_inventories(path):
    assert_clean(published.check_inventory(path))


@pytest.mark.parametrize("path", FILES["roles"], ids=ids(FILES["roles"]))
def test_role_defaults_match_argument_specs(path):
    assert_clean(published.check_role(path))


def test_there_is_something_to_check():
    assert FILES["plugins"] and FILES["markdown"]


# The checks can fail: deliberately broken examples are caught, each named with its file and line.

def test_broken_module_example_is_caught_with_file_and_line():
    path = os.path.join(FIXTURES, "broken_module.py")
    problems = [str(p) for p in published.check_plugin_file(path, DOCUMENTED)]
    assert any(":24: llmgw.fleet.wait_for_node:" in p and "timout" in p for p in problems), problems
    assert any(":31: llmgw.fleet.wait_for_node:" in p and "private_key_file" in p for p in problems), problems


def test_broken_markdown_is_caught_with_file_and_line():
    problems = [str(p) for p in published.check_markdown_file(os.path.join(FIXTURES, "broken.md"), DOCUMENTED)]
    assert any(p.startswith("tests/examples/fixtures/broken.md:7: YAML does not parse") for p in problems), problems
    assert any(p.startswith("tests/examples/fixtures/broken.md:11: llmgw.fleet.wait_for_node") for p in problems)
    assert any(p.startswith("tests/examples/fixtures/broken.md:18: shell does not parse") for p in problems)


def test_broken_link_and_missing_path_are_caught_with_file_and_line():
    problems = [str(p) for p in published.check_markdown_links(os.path.join(FIXTURES, "broken.md"))]
    assert problems == [
        "tests/examples/fixtures/broken.md:21: link to no-such-page.md, which does not exist",
        "tests/examples/fixtures/broken.md:22: names plugins/module_utils/no_such_core.py, which does not exist",
    ], problems
