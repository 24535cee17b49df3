"""The round's closing table in a log file (``orchestrate round > night.log``, ``nohup``):
rich lays a table out at 80 columns where its output is no terminal, so each change wrapped
over four lines, a knob's name was cut (``cuda_gra…``), and so were the objective's header and
a failure's class. Where stdout is no terminal and ``COLUMNS`` names no width, the table is now
laid out as wide as its rows need: one line a row, as a terminal wide enough shows it."""

from __future__ import annotations

import os
from pathlib import Path

from ledger import Ledger
from orchestrator.display import describe
from tests.fixtures.cli import orchestrate
from tests.fixtures.profiles import small_fast_profile


def rows(log: str) -> list[str]:
    """The table's lines between its header and its bottom rule."""
    lines = log.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("┡"))
    end = next(i for i, line in enumerate(lines) if line.startswith("└"))
    return lines[start + 1 : end]


def test_the_round_table_in_a_log_file_keeps_each_row_on_one_line(tmp_path: Path) -> None:
    profile = str(small_fast_profile(tmp_path))
    env = {
        **os.environ,
        "ORCHESTRATE_LEDGER": f"sqlite:///{tmp_path}/orchestrate.db",
        "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db",
    }
    env.pop("COLUMNS", None)
    done = orchestrate(tmp_path, "round", "-n", "2", "-p", profile, env=env, timeout=400)
    assert done.returncode == 0, done.stderr
    with Ledger(env["ORCHESTRATE_LEDGER"]) as ledger:
        experiments = ledger.experiments(cluster="twin-local")
    assert len(experiments) == 3, experiments
    table = rows(done.stdout)
    # one line a row, each whole: the change as the ledger describes it, its verdict, its note
    assert len(table) == len(experiments), done.stdout
    for line, e in zip(table, experiments, strict=True):
        cells = [c.strip() for c in line.strip("│").split("│")]
        assert cells[0] == str(e.id) and cells[2] == describe(e), (cells, e)
        assert cells[6] == (e.status or e.state), cells
        assert (e.failure_class or "") in cells[7], cells
    assert "…" not in done.stdout.split("Round 1", 1)[1], done.stdout
    assert "objective" in done.stdout

    # a width asked for is the width used (COLUMNS, as rich reads it): the row wraps there
    again = orchestrate(
        tmp_path, "round", "-n", "1", "-p", profile, env={**env, "COLUMNS": "80"}, timeout=400
    )
    assert again.returncode == 0, again.stderr
    assert len(rows(again.stdout.split("Round 2", 1)[1])) > 1, again.stdout  # one row, wrapped
