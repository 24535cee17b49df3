"""A proposal's way into the ledger: recorded as pending, then (once the veto gate decided)
an experiment to run, or a vetoed experiment decided without a boot.

Both are one knob away from the champion of the moment (or a coupled move, two: ``agents.
coupled``), validated by ``KnobSpace.change`` again (the ledger's value, or a person's edit,
is never trusted as is).
"""

from __future__ import annotations

from agents import Proposal
from knobs.vocabulary import Kind, Status
from ledger import ExperimentRecord, Ledger, ProposalRecord, RoundRecord, VerdictRecord
from orchestrator.champion import ChampionEvidence
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
        """The experiment of an approved proposal, recorded."""
        e = self._add(rnd, p, "({source})")
        crashpoint("experiment.recorded")
        return e

    def veto(self, rnd: RoundRecord, p: ProposalRecord) -> None:
        """A vetoed proposal as a decided experiment: no boot, a known-bad region with the
        person's reason, a tagged MLflow run."""
        e = self._add(rnd, p, "vetoed by {decided_by}: {reason}")
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
        self.display.decided(decided, verdict.reason)

    def _add(self, rnd: RoundRecord, p: ProposalRecord, how: str) -> ExperimentRecord:
        """The proposal's change applied to the champion of the moment, as an experiment;
        ``how``: what its description says after the change (the proposal's fields)."""
        champion = self.champion.current()
        space = self.profile.space
        change = (
            space.change(champion.config, p.knob, p.new_value)
            if p.coupled_knob is None
            else space.coupled_change(
                champion.config, p.knob, p.new_value, p.coupled_knob, p.coupled_new
            )
        )
        enabling = change.enabling
        told = how.format(source=p.source, decided_by=p.decided_by, reason=p.reason or "")
        return self.ledger.add_experiment(
            cluster=self.cluster,
            round_id=rnd.id,
            kind=Kind.CANDIDATE,
            config=champion.config.apply(change),
            champion_key=champion.config.key,
            champion_objective=champion.objective,
            proposal_id=p.id,
            knob=change.knob,
            value=change.new,
            description=f"{change.describe()} {told}".strip(),
            coupled=None if enabling is None else (enabling.knob, enabling.new),
        )
