"""A second engine build for upgrade tests, from the lab's build (tests/lab/engine/build.py) in seconds.

    .venv/bin/python tests/lab/engine/restamp.py OUT_DIR BUILD_NUMBER [--rename-flag OLD=NEW]

Writes OUT_DIR/llama-b<BUILD_NUMBER>-bin-linux-x64.tar.gz (release layout llama-b<N>/...) and prints
{"version", "archive", "sha256"} as JSON. Every file is the lab build's but llama-server, which becomes a wrapper
around the real binary (kept beside it as llama-server.real, so that its $ORIGIN rpath and backend search are
unchanged):

* ``--version`` reports build BUILD_NUMBER instead of the lab's: the version the collection reads and records;
* with ``--rename-flag OLD=NEW``, ``--help`` lists NEW where the real engine lists OLD, and a command line with OLD
  fails as llama.cpp fails on an unknown argument: a build that renamed a flag the launcher passes.

A rebuild from the same sources with another build number would take the lab's build time again (8 minutes on two
cores) for the same binaries; the version stamp is the only thing an upgrade test needs to differ.
"""

import argparse
import json
import os
import shutil
import stat
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import build  # noqa: E402  (tests/lab/engine/build.py: the lab build's cache, sha256_of and pack)

WRAPPER = """#!/bin/sh
# llama-server of the lab build b{old}, restamped b{new} by tests/lab/engine/restamp.py{renamed_note}
real="$(dirname "$(readlink -f "$0")")/llama-server.real"
for arg in "$@"; do
  case "$arg" in
    --version) "$real" "$@" 2>&1 | sed 's/(build {old}/(build {new}/; s/^version: {old}/version: {new}/'; exit 0 ;;
    --help|-h) "$real" "$@" 2>&1 | sed {help_sed}; exit 0 ;;{refuse}
  esac
done
exec "$real" "$@"
"""
REFUSE = """
    {old_flag}) echo "error: invalid argument: {old_flag}" >&2; exit 1 ;;"""


def restamp(out_dir, number, rename=None):
    with open(build.LAB_POINTER) as handle:
        lab = json.load(handle)
    old = lab["version"].lstrip("b")
    tag = "b%s" % number
    tree = os.path.join(out_dir, "llama-" + tag)
    shutil.rmtree(tree, ignore_errors=True)
    shutil.copytree(lab["dir"], tree, symlinks=True)
    server = os.path.join(tree, "llama-server")
    os.rename(server, server + ".real")
    help_sed, refuse, note = "-n p", "", ""
    if rename:
        old_flag, new_flag = rename.split("=", 1)
        help_sed = "'s/%s\\b/%s/g'" % (old_flag.replace("-", "\\-"), new_flag)
        refuse = REFUSE.format(old_flag=old_flag)
        note = ", with %s renamed %s" % (old_flag, new_flag)
    with open(server, "w") as handle:
        handle.write(WRAPPER.format(old=old, new=number, help_sed=help_sed, refuse=refuse, renamed_note=note))
    os.chmod(server, os.stat(server + ".real").st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    archive = os.path.join(out_dir, "llama-%s-bin-linux-x64.tar.gz" % tag)
    build.pack(tree, archive)
    return {"version": tag, "archive": archive, "sha256": build.sha256_of(archive)}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir")
    parser.add_argument("build_number", type=int)
    parser.add_argument("--rename-flag", metavar="OLD=NEW")
    args = parser.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    print(json.dumps(restamp(args.out_dir, args.build_number, args.rename_flag)))


if __name__ == "__main__":
    main()
