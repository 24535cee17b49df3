"""``python -m orchestrator.engines`` is ``orchestrate engines`` (what ``make engines`` runs)."""

import sys

from orchestrator.engines.cli import run

sys.exit(run())
