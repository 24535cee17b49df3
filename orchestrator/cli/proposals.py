"""``orchestrate proposals``: the proposals a round waits on (``--approve queue``), decided from
another terminal."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from orchestrator.cli.common import JsonOpt, ProfileOpt, VetoReason, in_ledger, opened

proposals_app = typer.Typer(
    help="Proposals waiting for a person (--approve queue).", no_args_is_help=True
)

ProposalId = Annotated[int, typer.Argument(min=1, callback=in_ledger, help="the proposal's ID")]


@proposals_app.command("list")
def proposals_list(
    profile: ProfileOpt = None,
    all_: Annotated[bool, typer.Option("--all", help="decided ones too")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Proposals waiting for a decision (or all of them)."""
    from knobs.vocabulary import ProposalStatus
    from orchestrator.profile import load_profile

    prof = load_profile(profile)
    with opened(prof) as o:
        rows = o.ledger(create=False).proposals(
            status=None if all_ else ProposalStatus.PENDING, cluster=prof.cluster.name
        )
    if as_json:
        typer.echo(json.dumps([p.model_dump(mode="json") for p in rows], indent=2))
        return
    if not rows:
        typer.echo("no pending proposals")
    for p in rows:
        typer.echo(f"{p.id}\t{p.status}\t{p.change.describe()}\t{p.source}\t{p.hypothesis}")


@proposals_app.command("approve")
def proposals_approve(proposal_id: ProposalId, profile: ProfileOpt = None) -> None:
    """Approve a pending proposal; the waiting round deploys it."""
    from knobs.vocabulary import ProposalStatus
    from orchestrator.profile import load_profile

    prof = load_profile(profile)
    with opened(prof) as o:
        p = o.ledger(create=False).decide_proposal(
            proposal_id, status=ProposalStatus.APPROVED, by="person", cluster=prof.cluster.name
        )
    typer.echo(f"approved proposal {p.id}: {p.change.describe()}")


@proposals_app.command("veto")
def proposals_veto(
    proposal_id: ProposalId,
    reason: VetoReason,
    profile: ProfileOpt = None,
) -> None:
    """Veto a pending proposal; it is recorded and never proposed again."""
    from knobs.vocabulary import ProposalStatus
    from orchestrator.profile import load_profile

    prof = load_profile(profile)
    with opened(prof) as o:
        p = o.ledger(create=False).decide_proposal(
            proposal_id,
            status=ProposalStatus.VETOED,
            by="person",
            reason=reason,
            cluster=prof.cluster.name,
        )
    typer.echo(f"vetoed proposal {p.id}: {p.change.describe()}")
