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
    from orchestrator.profile import load_profile
    from orchestrator.report import check_folder, write_report

    prof = load_profile(profile)
    if out is not None:
        check_folder(out)  # before the ledger is opened (or created) and the plots drawn
    with opened(prof) as o:
        written = write_report(prof, o.ledger(create=False), round_id, out)
    typer.echo(f"wrote {written.page} (round {written.data.round.id})")
