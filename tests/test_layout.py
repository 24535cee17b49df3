"""The layout's promises that import-linter cannot see."""

from __future__ import annotations

import subprocess
import sys


def test_the_error_root_loads_nothing_else_of_ours() -> None:
    """Every package imports ``orchestrator.errors``: importing it must not drag the round loop
    (or anything of ours) into a twin node or a proposer."""
    code = (
        "import sys, orchestrator.errors; "
        "print(sorted(m for m in sys.modules "
        "if m.split('.')[0] in ('orchestrator', 'agents', 'knobs', 'ledger', 'cluster')))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert loaded == "['orchestrator', 'orchestrator.errors']"
