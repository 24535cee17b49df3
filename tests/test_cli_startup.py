"""What ``orchestrate --help`` and a TAB of shell completion load: typer and the commands'
signatures, never the ledger, the proposers or SSH (SQLAlchemy, Optuna, MLflow, paramiko,
anthropic), which cost most of a second each time a person presses TAB. Each case runs the
console script's entry point in a fresh interpreter and reads ``sys.modules`` as it exits; a
command that does its work still loads what it needs (the last case)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

#: Loaded by the commands' work, never by their help or completion.
HEAVY = (
    "sqlalchemy",
    "optuna",
    "mlflow",
    "paramiko",
    "anthropic",
    "alembic",
    "matplotlib",
    "ledger",
    "agents",
    "orchestrator.round",
    "orchestrator.profile",
)

_PROBE = """
import atexit, json, sys
heavy = json.loads(sys.argv[1])
atexit.register(lambda: print("LOADED " + json.dumps([m for m in heavy if m in sys.modules])))
from orchestrator.cli import run
sys.exit(run(sys.argv[2:]))
"""


def _loaded(argv: list[str], env: dict[str, str] | None = None) -> tuple[list[str], str]:
    """The heavy modules a run of ``orchestrate ARGV`` loaded, and what it printed."""
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(HEAVY), *argv],
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    lines = done.stdout.splitlines()
    marker = [line for line in lines if line.startswith("LOADED ")]
    assert marker, f"the probe did not finish: {done.stderr[-2000:]}"
    return json.loads(marker[-1][len("LOADED ") :]), "\n".join(lines[:-1])


@pytest.mark.parametrize(
    "argv",
    [["--help"], ["round", "--help"], ["proposals", "--help"], ["cluster", "up", "--help"]],
)
def test_help_loads_no_ledger_proposer_or_ssh(argv: list[str]) -> None:
    loaded, printed = _loaded(argv)
    assert loaded == [], f"orchestrate {' '.join(argv)} loaded {loaded}"
    assert "Usage: orchestrate" in printed


@pytest.mark.parametrize(
    ("words", "offered"),
    [
        ("orchestrate ro", "round"),
        ("orchestrate round --bu", "--budget"),
        ("orchestrate round --proposer ", "hybrid"),
        ("orchestrate status --profile ", "twin"),
    ],
)
def test_tab_loads_none_of_them(words: str, offered: str) -> None:
    env = {
        "_ORCHESTRATE_COMPLETE": "complete_bash",
        "COMP_WORDS": words,
        # the word being completed: the last one, or a new one after a space
        "COMP_CWORD": str(len(words.split()) - (0 if words.endswith(" ") else 1)),
    }
    loaded, printed = _loaded([], env)
    assert loaded == [], f"TAB after {words!r} loaded {loaded}"
    assert offered in printed.split()


def test_a_command_that_works_loads_what_it_needs(tmp_path: object) -> None:
    from ledger import Ledger

    url = f"sqlite:///{tmp_path}/ledger.db"
    Ledger(url).close()  # status reads a ledger, and creates none
    loaded, printed = _loaded(["status", "--json"], {"ORCHESTRATE_LEDGER": url})
    assert {"ledger", "sqlalchemy", "orchestrator.profile"} <= set(loaded)
    assert json.loads(printed)["champion"] is None
