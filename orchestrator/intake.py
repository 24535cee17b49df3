"""A proposal's way into the ledger: recorded as pending, then (once the veto gate decided)
an experiment to run, or a vetoed experiment decided without a boot.

Both are one knob away from the champion of the moment (or a coupled move, two: ``agents.
coupled``), validated by ``KnobSpace.change`` again (the ledger's value, or a person's edit,
is never trusted as is) — but a change the profile can no longer run (a knob it lost since it
was proposed, a value outside a domain it narrowed since), which no space can validate: it is
recorded as proposed, for the round to close it without a boot (``closures.closure``).
"""

from __future__ import annotations

from collections.abc import Sequence

from agents import Proposal
from knobs.config import Change
from knobs.vocabulary import Kind, Status
from ledger import ExperimentRecord, Ledger, ProposalRecord, RoundRecord, VerdictRecord
from orchestrator import knob_renames
from orchestrator.approval import edit_words
from orchestrator.busy_host import looks_at
from orchestrator.champion import ChampionEvidence
from orchestrator.closures import CLOSED_BY, Closure, close, closure
from orchestrator.crashpoints import crashpoint
from orchestrator.display import RoundDisplay
from orchestrator.profile import Profile
from orchestrator.runlog import RunLog


class Intake:
    """Records proposals and turns decided ones into experiments."""

    def __init__(
        self,
        profile: Profile,
        ledger: Ledger,
        champion: ChampionEvidence,
        runlog: RunLog,
        display: RoundDisplay,
    ) -> None:
        self.profile = profile
        self.ledger = ledger
        self.champion = champion
        self.runlog = runlog
        self.display = display
        self.cluster = profile.cluster.name

    def record(self, rnd: RoundRecord, proposal: Proposal) -> ProposalRecord:
        """The proposal, pending, in the ledger."""
        champion = self.champion.current()
        enabling = proposal.change.enabling
        return self.ledger.add_proposal(
            round_id=rnd.id,
            source=proposal.source,
            knob=proposal.change.knob,
            old_value=proposal.change.old,
            new_value=proposal.change.new,
            champion_key=champion.config.key,
            hypothesis=proposal.hypothesis,
            expected_effect=proposal.expected_effect,
            risk=proposal.risk,
            estimated_cost=proposal.estimated_cost,
            notes=dict(proposal.notes),
            coupled=None if enabling is None else (enabling.knob, enabling.old, enabling.new),
        )

    def experiment(self, rnd: RoundRecord, p: ProposalRecord) -> ExperimentRecord:
        """The experiment of an approved proposal, recorded. A change decided before under the
        same champion (a second look: one the verdict stopped for want of boots) says which
        look it is, in its description and so everywhere it is shown: ``(optuna, second
        look)``; one a person edited says so, and the value proposed: ``(optuna, edited by
        person from 2048)``."""
        e = self._add(rnd, p, "({source}{edit}{look})")
        crashpoint("experiment.recorded")
        return e

    def veto(self, rnd: RoundRecord, p: ProposalRecord) -> None:
        """A vetoed proposal as a decided experiment: no boot, a known-bad region with the
        person's reason, a tagged MLflow run. One the profile closed (its knob lost, its value
        outside the domain: ``closures.closure``) bars nothing."""
        why = self.closure(p)
        by_profile = why is not None and p.decided_by == CLOSED_BY
        e = self._add(rnd, p, "({source})" if by_profile else "vetoed by {decided_by}: {reason}")
        if why is not None and by_profile:
            decided = close(self.ledger, e, why)
        else:
            verdict = VerdictRecord(
                status=Status.VETOED,
                rule="veto",
                reason=p.reason or "vetoed",
                stats={"by": p.decided_by},
            )
            decided = self.ledger.decide(
                e.id, verdict=verdict, objective=None, delta_pct=None, accept_len=None
            )
        run_id = self.runlog.experiment_run(rnd, decided)
        self.runlog.vetoed(run_id, decided, p.reason or "")
        # the line names the change as proposed (a closed one's description says why too); a
        # person's veto's description says who vetoed it and why: the reason is not said twice
        shown = decided.model_copy(update={"description": e.description})
        self.display.decided(shown, (p.reason or "vetoed") if by_profile else "")

    def closure(self, p: ProposalRecord) -> Closure | None:
        """Why the profile of now closes proposal ``p`` without a boot (``closures.closure``:
        its knob lost, its value outside the domain, or its config, the champion of the moment
        with its change, a combination the profile forbids now); ``None``: it may run."""
        p = knob_renames.proposal(self.profile.space, p)  # a knob renamed since: its own
        champion = self.champion.current()
        return closure(
            self.profile.space,
            p.knob,
            p.new_value,
            p.coupled_knob,
            p.coupled_new,
            lambda: champion.config.apply(_as_proposed(p)),
        )

    def _add(self, rnd: RoundRecord, p: ProposalRecord, how: str) -> ExperimentRecord:
        """The proposal's change applied to the champion of the moment, as an experiment;
        ``how``: what its description says after the change (the proposal's fields)."""
        p = knob_renames.proposal(self.profile.space, p)  # a knob renamed since: its own
        champion = self.champion.current()
        space = self.profile.space
        if self.closure(p) is not None:
            # no space validates what the profile can no longer run: recorded as proposed,
            # never booted
            change = _as_proposed(p)
        else:
            change = (
                space.change(champion.config, p.knob, p.new_value)
                if p.coupled_knob is None
                else space.coupled_change(
                    champion.config, p.knob, p.new_value, p.coupled_knob, p.coupled_new
                )
            )
        enabling = change.enabling
        config = champion.config.apply(change)
        look = (
            ""
            if "{look}" not in how
            else look_words(looks_at(self.profile, self.ledger, config.key, champion.config.key))
        )
        told = how.format(
            source=p.source,
            decided_by=p.decided_by,
            reason=p.reason or "",
            look=look,
            edit=edit_words(p),
        )
        return self.ledger.add_experiment(
            cluster=self.cluster,
            round_id=rnd.id,
            kind=Kind.CANDIDATE,
            config=config,
            champion_key=champion.config.key,
            champion_objective=champion.objective,
            proposal_id=p.id,
            knob=change.knob,
            value=change.new,
            description=f"{change.describe()} {told}".strip(),
            coupled=None if enabling is None else (enabling.knob, enabling.new),
            parent=champion.experiment_id,
        )


_ORDINALS = ("second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth")


def look_words(earlier: Sequence[int]) -> str:
    """What a change's description says of its ``earlier`` looks under the same champion (their
    experiments, oldest first): nothing for a first look, ``, second look after #5`` for the
    next, then ``, third look after #5 and #7``…: each look names those before it, so a change
    recorded as stopped for want of boots (``experiment.look_note``) and the look it was given
    after read as one story."""
    n = len(earlier)
    if n <= 0:
        return ""
    nth = f"{_ORDINALS[n - 1]} look" if n <= len(_ORDINALS) else f"look {n + 1}"
    ids = [f"#{i}" for i in earlier]
    named = ids[0] if n == 1 else ", ".join(ids[:-1]) + " and " + ids[-1]
    return f", {nth} after {named}"


def _as_proposed(p: ProposalRecord) -> Change:
    """Proposal ``p``'s change as it was recorded, validated by no space (one the profile can
    no longer run is recorded as proposed, never booted)."""
    return Change(
        knob=p.knob,
        old=p.old_value,
        new=p.new_value,
        enabling=None
        if p.coupled_knob is None or p.coupled_old is None or p.coupled_new is None
        else Change(knob=p.coupled_knob, old=p.coupled_old, new=p.coupled_new),
    )
