"""The veto gate between a proposal and a boot: auto, ask (a person at this terminal), or
queue (the round waits; a person decides with ``orchestrate proposals approve|veto``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from agents import ProposalContext
from knobs.errors import KnobError, UsageError
from knobs.spec import Value
from ledger import Ledger, ProposalRecord


@dataclass(frozen=True)
class Answer:
    """A person's answer at the ``ask`` prompt."""

    action: str  # approve | edit | veto
    value: str | None = None
    reason: str | None = None


#: Shows a proposal (and, on a retry, why the last answer was refused) and returns an answer.
Asker = Callable[[ProposalRecord, str | None], Answer]


class ApprovalGate:
    """Decides every proposal before anything is deployed; each decision is committed."""

    def __init__(
        self,
        ledger: Ledger,
        mode: str,
        *,
        asker: Asker | None = None,
        queue_timeout_s: float | None = None,
        on_timeout: str = "veto",
        poll_s: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Raises:
        UsageError: an unknown mode, or ``ask`` without a terminal to ask at.
        """
        if mode not in ("auto", "ask", "queue"):
            raise UsageError(f"--approve {mode!r}: use auto, ask or queue")
        if mode == "ask" and asker is None:
            raise UsageError("--approve ask needs a terminal; use --approve queue instead")
        if on_timeout not in ("veto", "approve"):
            raise UsageError(f"queue timeout action {on_timeout!r}: use veto or approve")
        self.ledger = ledger
        self.mode = mode
        self.asker = asker
        self.queue_timeout_s = queue_timeout_s
        self.on_timeout = on_timeout
        self.poll_s = poll_s
        self._clock = clock

    def decide(self, proposal: ProposalRecord, context: ProposalContext) -> ProposalRecord:
        """The decided proposal (approved, possibly with an edited value, or vetoed)."""
        if proposal.status != "pending":
            return proposal
        if self.mode == "auto":
            return self.ledger.decide_proposal(proposal.id, status="approved", by="auto")
        if self.mode == "ask":
            return self._ask(proposal, context)
        return self._wait(proposal)

    def _ask(self, proposal: ProposalRecord, context: ProposalContext) -> ProposalRecord:
        assert self.asker is not None
        problem: str | None = None
        while True:
            answer = self.asker(proposal, problem)
            if answer.action == "approve":
                return self.ledger.decide_proposal(proposal.id, status="approved", by="person")
            if answer.action == "veto":
                reason = (answer.reason or "").strip() or "vetoed at the prompt"
                return self.ledger.decide_proposal(
                    proposal.id, status="vetoed", by="person", reason=reason
                )
            if answer.action == "edit":
                try:
                    change = context.space.change(context.champion, proposal.knob, answer.value)
                except KnobError as e:
                    problem = e.message
                    continue
                refusal = context.refusal(change)
                if refusal is not None:
                    problem = refusal.reason
                    continue
                new: Value = change.new
                return self.ledger.decide_proposal(
                    proposal.id, status="approved", by="person (edited)", new_value=new
                )
            problem = f"unknown answer {answer.action!r}: approve, edit or veto"

    def _wait(self, proposal: ProposalRecord) -> ProposalRecord:
        deadline = None if self.queue_timeout_s is None else self._clock() + self.queue_timeout_s
        while True:
            current = self.ledger.proposal(proposal.id)
            if current.status != "pending":
                return current
            if deadline is not None and self._clock() >= deadline:
                status = "approved" if self.on_timeout == "approve" else "vetoed"
                return self.ledger.decide_proposal(
                    proposal.id,
                    status=status,
                    by="timeout",
                    reason=f"no decision within {self.queue_timeout_s:g}s",
                )
            time.sleep(self.poll_s)
