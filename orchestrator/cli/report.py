"""``orchestrate report``: a round's report, an HTML page with its plots."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from orchestrator.cli.common import ProfileOpt, in_ledger, opened


def report(
    round_id: Annotated[
        int | None,
        typer.Option("--round", min=1, callback=in_ledger, help="the round (default: the last)"),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option("--out", help="folder to write into (default: reports/round-N)"),
    ] = None,
    profile: ProfileOpt = None,
) -> None:
    """Write a round's report: progress, per-knob effects, where the boots and GPU-hours went,
    the champion's launcher diff; one self-contained HTML page and its PNGs."""
    from orchestrator import round_close
    from orchestrator.profile import load_profile
    from orchestrator.report import check_folder, write_report

    prof = load_profile(profile)
    if out is not None:
        check_folder(out)  # before the ledger is opened (or created) and the plots drawn
    with opened(prof) as o:
        ledger = o.ledger(create=False)
        written = write_report(prof, ledger, round_id, out)
        unclosed = written.data.round.id in round_close.owed(ledger, prof.cluster.name)
    typer.echo(f"wrote {written.page} (round {written.data.round.id})")
    if unclosed:  # this command writes no MLflow: the next round does (``round_close``)
        typer.echo(
            f"MLflow's run of round {written.data.round.id} lacks this report, results.tsv and "
            "the round's numbers (the command that closed it stopped as it wrote them): the "
            "next `orchestrate round` writes them"
        )
