"""``orchestrate known-bad``: the regions no proposer may enter, and clearing one a person
knows to be wrong (a flaky failure, a veto given in error)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Any

import typer

from orchestrator.cli.common import JsonOpt, ProfileOpt, in_ledger, opened
from orchestrator.people import person

if TYPE_CHECKING:
    from orchestrator.known_bad import BarredRegion

known_bad_app = typer.Typer(
    help="Regions of the knob space the cluster's verdicts bar.", no_args_is_help=True
)


def _as_json(r: BarredRegion) -> dict[str, Any]:
    e = r.experiment
    return {
        "id": e.id,
        "source": r.region.source,
        "region": r.region.region(),
        "reason": r.region.reason,
        # fitted to the profile of now: how the experiment ran otherwise (empty: the same)
        "as_it_ran": r.as_it_ran,
        "knob": e.knob,
        "value": e.value,
        "status": e.status,
        "failure_class": e.failure_class,
        "decided_at": None if e.decided_at is None else e.decided_at.isoformat(),
        "champion": r.champion,
        "champion_key": e.champion_key,
        "cleared": None
        if r.cleared is None
        else {
            "by": r.cleared.actor,
            "at": r.cleared.created_at.isoformat(),
            "reason": r.cleared.reason,
        },
    }


@known_bad_app.command("list")
def known_bad_list(profile: ProfileOpt = None, as_json: JsonOpt = False) -> None:
    """Every known-bad region of the profile's cluster: the experiment that barred it (its ID),
    why, when and under which champion; cleared ones are marked so, with who cleared them and
    why."""
    from orchestrator.known_bad import barred_regions
    from orchestrator.profile import load_profile

    prof = load_profile(profile)
    with opened(prof) as o:
        regions = barred_regions(prof, o.ledger(create=False))
    if as_json:
        typer.echo(json.dumps([_as_json(r) for r in regions], indent=2))
        return
    if not regions:
        typer.echo(f"no known-bad regions on cluster {prof.cluster.name}")
        return
    rows: list[tuple[str, ...]] = [
        ("ID", "source", "region", "reason", "decided", "champion", "cleared")
    ]
    rows += [_row(r) for r in regions]
    # aligned columns, one region a line, whatever the terminal's width (grep and cut work)
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        typer.echo("  ".join([*(c.ljust(w) for c, w in zip(row, widths, strict=False)), row[-1]]))
    live = sum(1 for r in regions if r.cleared is None)
    typer.echo(f"{live} barred, {len(regions) - live} cleared")


def _row(r: BarredRegion) -> tuple[str, ...]:
    from orchestrator.timestamps import utc_minute

    e = r.experiment
    return (
        str(e.id),
        r.region.source,
        r.region.region() + (f" ({r.as_it_ran})" if r.as_it_ran else ""),
        r.region.reason,
        "-" if e.decided_at is None else utc_minute(e.decided_at),
        "-" if r.champion is None else f"#{r.champion}",
        "-"
        if r.cleared is None
        else f"by {r.cleared.actor or '?'} on {r.cleared.created_at:%Y-%m-%d}: {r.cleared.reason}",
    )


@known_bad_app.command("clear")
def known_bad_clear(
    experiment_id: Annotated[
        int,
        typer.Argument(min=1, callback=in_ledger, help="the ID of the experiment that barred it"),
    ],
    reason: Annotated[str, typer.Option("--reason", help="why it is cleared (recorded)")],
    profile: ProfileOpt = None,
) -> None:
    """Clear a known-bad region: proposers may enter it again. The experiment and its verdict
    stay in the ledger and results.tsv as they were; the clearing is recorded with who and
    why."""
    from orchestrator.known_bad import clear_region
    from orchestrator.profile import load_profile

    prof = load_profile(profile)
    actor = person()
    with opened(prof) as o:
        found, event = clear_region(
            prof, o.ledger(create=False), experiment_id, reason=reason, actor=actor
        )
    typer.echo(
        f"cleared {found.region.region()} (barred by experiment #{experiment_id}, "
        f"{found.region.source}: {found.region.reason}); recorded as event {event.id} by {actor}"
    )
