"""``orchestrate proposals``: the proposals a round waits on (``--approve queue``), decided from
another terminal."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated

import typer

from orchestrator.cli.common import JsonOpt, ProfileOpt, VetoReason, in_ledger, opened, out
from orchestrator.people import person

if TYPE_CHECKING:
    from ledger import Ledger, ProposalRecord
    from orchestrator.profile import Profile

proposals_app = typer.Typer(
    help="Proposals waiting for a person (--approve queue).", no_args_is_help=True
)

#: ``proposals list``'s header: who decided (``user@host``, ``timeout``, ``profile``; ``-``
#: while it waits); a reason is a veto's (or a rejection's), ``-`` when none; the experiment is
#: the one the proposal became (results.tsv's), ``-`` while it waits
COLUMNS = (
    "proposal", "status", "decided by", "experiment", "change", "source", "reason", "hypothesis"
)  # fmt: skip

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
        ledger = o.ledger(create=False)
        rows = ledger.proposals(
            status=None if all_ else ProposalStatus.PENDING, cluster=prof.cluster.name
        )
        became = _became(ledger, prof.cluster.name)
    if as_json:
        shown = [p.model_dump(mode="json") | {"experiment": became.get(p.id)} for p in rows]
        typer.echo(json.dumps(shown, indent=2))
        return
    if not rows:
        typer.echo("no pending proposals" if not all_ else "no proposals")
        return
    typer.echo("\t".join(COLUMNS))
    for p in rows:
        experiment = became.get(p.id)
        fields = (
            str(p.id),
            str(p.status),
            p.decided_by or "-",
            "-" if experiment is None else f"#{experiment}",
            p.change.describe(),
            p.source,
            p.reason or "-",
            p.hypothesis,
        )
        typer.echo("\t".join(" ".join(f.split()) for f in fields))


@proposals_app.command("show")
def proposals_show(
    proposal_id: ProposalId, profile: ProfileOpt = None, as_json: JsonOpt = False
) -> None:
    """One proposal: its change, its decision (a veto's reason), the experiment it became,
    and its reasoning (hypothesis, expected effect, risk, cost)."""
    from orchestrator.approval import proposal_rows
    from orchestrator.profile import load_profile

    prof = load_profile(profile)
    with opened(prof) as o:
        ledger = o.ledger(create=False)
        p = ledger.proposal(proposal_id, cluster=prof.cluster.name)
        experiment = _became(ledger, prof.cluster.name).get(p.id)
    if as_json:
        typer.echo(json.dumps(p.model_dump(mode="json") | {"experiment": experiment}, indent=2))
        return
    decided = "" if p.decided_by is None else f" by {p.decided_by}"
    rows = [
        ("status", f"{p.status}{decided}" + ("" if p.reason is None else f": {p.reason}")),
        ("experiment", "-" if experiment is None else f"#{experiment}"),
        *proposal_rows(p),
    ]
    console = out()
    console.print(
        f"proposal {p.id} of round {p.round_id} ({p.source}): {p.change.describe()}", markup=False
    )
    for label, value in rows:
        # proposal texts may come from an LLM: data, never console markup
        console.print(f"  {label + ':':<11} {' '.join(value.split())}", markup=False)


def _became(ledger: Ledger, cluster: str) -> dict[int, int]:
    """Each proposal's experiment: approved, or vetoed (a ``vetoed`` row of results.tsv)."""
    return {
        e.proposal_id: e.id
        for e in ledger.experiments(cluster=cluster)
        if e.proposal_id is not None
    }


@proposals_app.command("approve")
def proposals_approve(
    proposal_id: ProposalId,
    profile: ProfileOpt = None,
    value: Annotated[
        str | None,
        typer.Option(
            "--value",
            help="approve it with this value instead (checked as the ask prompt's edit is)",
        ),
    ] = None,
) -> None:
    """Approve a pending proposal (as proposed, or edited); the waiting round deploys it."""
    from knobs.vocabulary import ProposalStatus
    from orchestrator.profile import load_profile

    prof = load_profile(profile)
    with opened(prof) as o:
        ledger = o.ledger(create=False)
        if value is None:
            p = ledger.decide_proposal(
                proposal_id, status=ProposalStatus.APPROVED, by=person(), cluster=prof.cluster.name
            )
        else:
            p = _approve_edited(prof, ledger, proposal_id, value)
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
            by=person(),
            reason=reason,
            cluster=prof.cluster.name,
        )
    typer.echo(f"vetoed proposal {p.id}: {p.change.describe()}")


def _approve_edited(prof: Profile, ledger: Ledger, proposal_id: int, value: str) -> ProposalRecord:
    """Proposal ``proposal_id`` approved with ``value`` (``approval.approve_edited``), checked
    against what the proposer of its round sees now."""
    from knobs.vocabulary import ProposalStatus
    from orchestrator.approval import approve_edited
    from orchestrator.history import proposal_context_of

    p = ledger.proposal(proposal_id, cluster=prof.cluster.name)
    if p.status != ProposalStatus.PENDING:  # refused as a plain approve is, in its words
        return ledger.decide_proposal(
            proposal_id, status=ProposalStatus.APPROVED, by=person(), cluster=prof.cluster.name
        )
    context = proposal_context_of(prof, ledger, p.round_id)
    return approve_edited(ledger, p, context, value, cluster=prof.cluster.name)
