"""``orchestrate report``: a round's report, an HTML page with its plots."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from orchestrator.cli.common import Opened, ProfileOpt, in_ledger, opened

if TYPE_CHECKING:
    from ledger import Ledger, RoundRecord
    from orchestrator.profile import Profile
    from orchestrator.report import Written


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
    the champion's launcher diff; one self-contained HTML page and its PNGs. A round whose
    MLflow run still lacks its close (its command stopped as it wrote it) is given it."""
    from orchestrator import round_close
    from orchestrator.profile import load_profile
    from orchestrator.report import check_folder, write_report

    prof = load_profile(profile)
    if out is not None:
        check_folder(out)  # before the ledger is opened (or created) and the plots drawn
    with opened(prof) as o:
        ledger = o.ledger(create=False)
        written = write_report(prof, ledger, round_id, out)
        typer.echo(f"wrote {written.page} (round {written.data.round.id})")
        rnd = ledger.round(written.data.round.id)
        if rnd.id in round_close.owed(ledger, prof.cluster.name):
            _close_owed(prof, o, ledger, rnd, written)


def _close_owed(
    prof: Profile, o: Opened, ledger: Ledger, rnd: RoundRecord, written: Written
) -> None:
    """Round ``rnd``'s close, owed to MLflow (``round_close``), written with the report this
    command wrote (``round_report.settle_owed_close``, as the next round's start writes it), in
    one line; an MLflow away, or not the store this ledger's rounds logged to, leaves it owed,
    said so (nothing waited for, nothing lost)."""
    from ledger import MlflowSinkError
    from ledger.mlflow_sink import MlflowSink, mlflow_experiment
    from orchestrator.cli.common import out
    from orchestrator.cli.round_report import settle_owed_close, still_owed
    from orchestrator.display import RoundDisplay
    from orchestrator.mlflow_store import logged_before, the_same_store

    display = RoundDisplay(out())
    experiment = mlflow_experiment(prof.cluster.name)
    try:
        sink = the_same_store(
            lambda holds: MlflowSink(
                o.settings.mlflow_uri,
                experiment_name=experiment,
                artifact_root=o.settings.artifact_root,
                holds=holds,
            ),
            logged=logged_before(ledger, prof.cluster.name),
            new_store=False,
            configured=o.settings.mlflow_uri,
            experiment=experiment,
        )
    except MlflowSinkError as e:
        display.note(still_owed(rnd, e))
        return
    settle_owed_close(prof, ledger, sink, rnd, display, written)
