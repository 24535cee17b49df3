"""A round's next proposal: taken from the queue or proposed, recorded, closed where the
profile can no longer run it, and passed through the veto gate to the experiment it becomes
(``RoundRunner``'s loop dispatches; what the proposer sees is ``history``'s, how a proposal is
recorded ``intake``'s, who approves it ``approval``'s)."""

from __future__ import annotations

from agents import ProposalContext, Proposer, proposed_by
from agents.llm_fallback import fallback_line
from knobs.vocabulary import ProposalStatus
from ledger import ExperimentRecord, Ledger, RoundRecord
from orchestrator import budget
from orchestrator.approval import ApprovalGate, NobodyDeciding
from orchestrator.champion import ChampionEvidence
from orchestrator.closures import CLOSED_BY
from orchestrator.crashpoints import crashpoint
from orchestrator.display import RoundDisplay
from orchestrator.history import proposal_context
from orchestrator.intake import Intake
from orchestrator.profile import Profile


class ProposalStep:
    """Proposes the round's next experiment and passes it through the veto gate."""

    def __init__(
        self,
        profile: Profile,
        ledger: Ledger,
        champion: ChampionEvidence,
        proposer: Proposer,
        gate: ApprovalGate,
        intake: Intake,
        display: RoundDisplay,
    ) -> None:
        self.profile = profile
        self.ledger = ledger
        self.champion = champion
        self.proposer = proposer
        self.gate = gate
        self.intake = intake
        self.display = display

    def context(self, rnd: RoundRecord) -> ProposalContext:
        """What the proposer sees now, built from the ledger."""
        return proposal_context(
            self.profile, self.ledger, self.champion, rnd, self._candidates_done(rnd)
        )

    def next_experiment(self, rnd: RoundRecord) -> ExperimentRecord | None:
        """Propose, record, pass the veto gate; the experiment to run, or None if vetoed.

        Raises:
            ProposalExhausted: nothing is left to propose (the round stops on it).
            NobodyDeciding: nobody approved in time (its veto is committed first).
        """
        index = self._candidates_done(rnd) + 1
        pending = [p for p in self.ledger.proposals(round_id=rnd.id, status=ProposalStatus.PENDING)]
        if pending:  # proposed before (a round stopped while it waited): nobody proposes now
            record = pending[0]
            self.display.experiment(index, rnd.budget, "from the queue")
            self.display.phase(f"proposal #{record.id} from the queue, proposed by {record.source}")
        else:
            self.display.experiment(index, rnd.budget, "proposing")
            context = self.context(rnd)
            # who really proposes: an LLM proposer's fallback while its API cools off
            self.display.phase(f"proposing ({proposed_by(self.proposer, context)})")
            proposal = self.proposer.propose(context)
            record = self.intake.record(rnd, proposal)
            crashpoint("proposal.recorded")
        self.display.experiment(index, rnd.budget, record.change.describe())
        fell_back = fallback_line(record.source, record.notes)
        if fell_back is not None:  # the LLM did not steer this one: said, with why
            self.display.note(f"  {fell_back}")
        why = self.intake.closure(record)
        if why is not None and record.status == ProposalStatus.PENDING:
            # a change the profile can no longer run (a knob lost, a domain narrowed since:
            # ``evolution``): nobody is asked to approve it; closed by the profile, barring
            # nothing
            closed = self.ledger.decide_proposal(
                record.id, status=ProposalStatus.VETOED, by=CLOSED_BY, reason=why.reason
            )
            self.intake.veto(rnd, closed)
            return None
        # the gate's mode: a resume's ``--approve`` runs it, whatever the round started with
        self.display.phase(f"waiting for approval ({self.gate.mode})")
        try:
            decision = self.gate.decide(record, self.context(rnd))
        except NobodyDeciding as paused:
            # the timeout's veto is committed: its experiment row before the round stops
            # (results.tsv, MLflow and known-bad have it, not only after a resume)
            self.intake.veto(rnd, paused.decided)
            raise
        crashpoint("proposal.approved")
        if decision.status == ProposalStatus.VETOED:
            self.intake.veto(rnd, decision)
            return None
        return self.intake.experiment(rnd, decision)

    def _candidates_done(self, rnd: RoundRecord) -> int:
        return budget.done(self.ledger.experiments(round_id=rnd.id))
