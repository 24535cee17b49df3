"""``orchestrate experiments``: one experiment as the ledger holds it (``show``), and an
experiment a stopped round left undecided, vetoed by a person so that the round's resume goes
on with the next change (``veto``)."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from orchestrator.cli.common import JsonOpt, ProfileOpt, in_ledger, opened, out, reading
from orchestrator.people import person

experiments_app = typer.Typer(
    help="One experiment's record, and a change a stopped round left undecided.",
    no_args_is_help=True,
)


@experiments_app.command("show")
def experiments_show(
    experiment_id: Annotated[
        int, typer.Argument(min=1, callback=in_ledger, help="the experiment's ID (results.tsv's)")
    ],
    profile: ProfileOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """One experiment as the ledger holds it: the change and its decision, the verdict's rule,
    reason and statistics, and each boot (its role, how it ended, the node a failed one failed
    on) with the cells it measured. Writes nothing, to an older ledger either."""
    from orchestrator.experiment_view import experiment_view, view_lines
    from orchestrator.profile import load_profile
    from orchestrator.settings import Settings

    prof = load_profile(profile)
    # read only: an older ledger is read as upgraded and left as it was (``ledger.reading``)
    with reading(Settings.resolve(prof).ledger_url) as ledger:
        view = experiment_view(
            ledger,
            prof.cluster.name,
            experiment_id,
            min_matmul_rate=prof.gates.min_matmul_rate,
            verdict_spec=prof.verdict,
        )
    if as_json:
        typer.echo(json.dumps(view, indent=2))
        return
    console = out()
    for line in view_lines(view):
        console.print(line, markup=False)


@experiments_app.command("veto")
def experiments_veto(
    experiment_id: Annotated[
        int, typer.Argument(min=1, callback=in_ledger, help="the undecided experiment's ID")
    ],
    reason: Annotated[str, typer.Option("--reason", help="why (shown to every proposer)")],
    profile: ProfileOpt = None,
) -> None:
    """Veto a change a stopped round left undecided (its weights cannot be fetched, it fails
    only on this stack's nodes): decided as vetoed with your reason, its boots kept, and barred
    as a vetoed proposal is (`orchestrate known-bad clear` lifts it). The same `orchestrate
    round` command then resumes the round with the next change. Refused while a round runs."""
    from orchestrator.history import region_of
    from orchestrator.profile import load_profile
    from orchestrator.undecided import veto_undecided

    prof = load_profile(profile)
    actor = person()
    with opened(prof) as o:
        ledger = o.ledger(create=False)
        e = veto_undecided(prof, ledger, experiment_id, reason=reason, actor=actor)
        region = region_of(prof, ledger, e)
    barred = "nothing" if region is None else region.region()
    typer.echo(
        f"vetoed experiment #{e.id} by {actor}: it bars {barred} (`orchestrate known-bad clear "
        f"{e.id} --reason …` lifts it); the same `orchestrate round` command resumes the round "
        "with the next change"
    )
