"""A round's lines in a log file (no terminal, no live status): the experiment's header and
its phases are printed as text. ``[baseline]`` was read as a rich markup tag and dropped, so a
night's log said only `baseline (champion as configured)`; a phase's brackets went the same
way."""

from __future__ import annotations

import io

from rich.console import Console

from orchestrator.display import RoundDisplay


def test_the_headers_and_phases_brackets_reach_a_log_file() -> None:
    log = io.StringIO()
    display = RoundDisplay(Console(file=log, width=200))
    display.experiment(0, 6, "baseline (champion as configured)")
    display.phase("cell [code-c1] 1 of 2")
    display.experiment(2, 6, "max_num_batched_tokens [bold]7168[/bold] → 4096")
    lines = log.getvalue().splitlines()
    assert lines == [
        "[baseline] baseline (champion as configured)",
        "    cell [code-c1] 1 of 2",
        "[2/6] max_num_batched_tokens [bold]7168[/bold] → 4096",
    ], lines
