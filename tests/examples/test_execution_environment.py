"""execution-environment.yml is a valid ansible-builder (version 3) definition whose build context can be made,
and it installs what the collection needs."""

import os
import shutil
import subprocess

import published
import yaml

DEFINITION = os.path.join(published.REPO, "execution-environment.yml")


def load():
    with open(DEFINITION) as handle:
        return yaml.safe_load(handle)


def test_ansible_builder_makes_the_build_context(tmp_path):
    definition = load()
    shutil.copy(DEFINITION, tmp_path / "execution-environment.yml")
    for entry in definition.get("additional_build_files", []):
        # The collection tarball is built before the image (docs/awx.md); a stand-in is enough to make the context.
        stand_in = tmp_path / entry["src"]
        stand_in.parent.mkdir(parents=True, exist_ok=True)
        stand_in.write_bytes(b"")
    result = subprocess.run([published.tool("ansible-builder"), "create", "-f", "execution-environment.yml",
                             "-c", "context", "--output-filename", "Containerfile"],
                            cwd=tmp_path, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    containerfile = (tmp_path / "context" / "Containerfile").read_text()
    assert "COPY _build/collections/ /tmp/llmgw-collections/" in containerfile
    requirements = yaml.safe_load((tmp_path / "context" / "_build" / "requirements.yml").read_text())
    assert {"name": "/tmp/llmgw-collections/llmgw-fleet-0.1.0.tar.gz", "type": "file"} in requirements["collections"]


def test_it_pins_what_the_controller_pins():
    """The image runs the same ansible-core and client libraries as the controller requirements."""
    with open(os.path.join(published.REPO, "requirements", "controller.txt")) as handle:
        pinned = dict(line.strip().split("==", 1) for line in handle if "==" in line and not line.startswith("#"))
    definition = load()
    core = definition["dependencies"]["ansible_core"]["package_pip"]
    assert core == "ansible-core==" + pinned["ansible-core"]
    for requirement in definition["dependencies"]["python"]:
        name, version = requirement.split("==")
        assert pinned.get(name) == version, "{} is pinned to {} in requirements/controller.txt".format(
            name, pinned.get(name))


def test_the_tarball_it_installs_is_this_collection_at_its_version():
    with open(os.path.join(published.REPO, "galaxy.yml")) as handle:
        galaxy = yaml.safe_load(handle)
    tarball = "{namespace}-{name}-{version}.tar.gz".format(**galaxy)
    sources = [entry["src"] for entry in load().get("additional_build_files", [])]
    assert "dist/" + tarball in sources, (tarball, sources)
