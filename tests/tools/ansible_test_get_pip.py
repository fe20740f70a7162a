"""Stand-in for the get-pip bootstrap script that ansible-test downloads from a host this machine cannot reach.

ansible-test runs it inside a fresh virtual environment with pip's install arguments. It bootstraps the pip
that ships with CPython (ensurepip), then lets that pip install the requested version from the package index.
The Makefile copies it to ~/.ansible/test/cache/get_pip_<version>.py, where ansible-test looks first.
"""

import subprocess
import sys

DROPPED = {"--no-setuptools", "--no-wheel"}


def main():
    # In a child process: ensurepip sets PIP_CONFIG_FILE=/dev/null in its own environment, which would hide the
    # machine's pip configuration (index, CA bundle) from the install below.
    subprocess.check_call([sys.executable, "-m", "ensurepip", "--upgrade"], stdout=subprocess.DEVNULL)
    args = [arg for arg in sys.argv[1:] if arg not in DROPPED]
    sys.exit(subprocess.call([sys.executable, "-m", "pip", "install"] + args))


if __name__ == "__main__":
    main()
