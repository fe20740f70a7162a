"""`python -m pve_lab up|down|status`."""

import sys

from pve_lab.cli import main

sys.exit(main())
