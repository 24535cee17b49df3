"""``python -m cluster.twin <command>``: see ``cluster.twin.cli``."""

from __future__ import annotations

import sys

from cluster.twin.cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
