"""The veto gate between a proposal and a boot: auto, ask (a person at this terminal), or
queue (the round waits; a person decides with ``orchestrate proposals approve|veto``).

Every decision is committed to the ledger before the gate returns. A vetoed proposal is
recorded by the round as a ``vetoed`` experiment (no boot) and becomes a known-bad region
that every proposer sees with its reason. In queue mode the profile may set a timeout and
what happens at it (veto or approve); when timeouts veto ``max_timeouts`` proposals in a row
nobody is deciding, and the gate stops the round (resumable) rather than let it propose,
and pay for proposals, forever.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from agents import COUPLED_NOTE, ProposalContext
from knobs.errors import KnobError
from knobs.records import LlmUsage
from knobs.spec import as_text
from knobs.vocabulary import ProposalStatus
from ledger import Ledger, LedgerError, ProposalRecord
from orchestrator.errors import OrchestrateError, UsageError
from orchestrator.people import edited_by, person


@dataclass(frozen=True)
class Answer:
    """A person's answer at the ``ask`` prompt."""

    action: str  # approve | edit | veto
    value: str | None = None
    reason: str | None = None


#: Shows a proposal (and, on a retry, why the last answer was refused) and returns an answer.
Asker = Callable[[ProposalRecord, str | None], Answer]


def llm_summary(notes: Mapping[str, str]) -> str:
    """What a proposal's LLM calls cost, from its notes (``''`` when no LLM was asked)."""
    usage = LlmUsage.from_notes(notes)
    if usage is None:
        return ""
    text = (
        f"{usage.model}: {usage.input_tokens:,.0f} in + "
        f"{usage.output_tokens:,.0f} out tokens, ${usage.cost_usd:.4f} "
        f"(round ${usage.round_spend_usd:.4f})"
    )
    if usage.fallback is not None:
        text += f"; fell back: {usage.fallback}"
    return text


class NobodyDeciding(OrchestrateError):
    """The queue's timeout vetoed ``timeouts`` proposals in a row: the round stops where it
    is (resumable, like an interruption) instead of proposing forever. Carries the count, the
    timeout and the last proposal the timeout vetoed (``decided``: committed to the ledger, for
    the round to record as its experiment before it stops)."""

    exit_code = 130

    def __init__(
        self, message: str, *, timeouts: int, timeout_s: float, decided: ProposalRecord
    ) -> None:
        super().__init__(message)
        self.timeouts = timeouts
        self.timeout_s = timeout_s
        self.decided = decided


#: Who decided a proposal the queue's timeout decided (``ProposalRecord.decided_by``, and the
#: ``by`` of its vetoed experiment's verdict): nobody judged its value (``history.timed_out``).
TIMEOUT_BY = "timeout"


#: The note an edited proposal keeps its proposed value in (as text).
EDITED_FROM = "edited_from"


def edit_words(p: ProposalRecord) -> str:
    """What an experiment's description says of a person's edit of its proposal:
    ``, edited by person from 2048`` (nothing for one approved as proposed)."""
    proposed = p.notes.get(EDITED_FROM)
    return "" if proposed is None else f", edited by person from {proposed}"


def proposal_rows(p: ProposalRecord) -> list[tuple[str, str]]:
    """A proposal's reasoning as labelled rows, as the ``ask`` prompt and ``orchestrate
    proposals show`` print them: a coupled move's note and the LLM's spend only when there is
    one, ``-`` for any other field left empty."""
    rows = [
        # a coupled move says so, and which failure it answers (``agents.coupled``)
        ("coupled", p.notes.get(COUPLED_NOTE, "") if p.coupled_knob else ""),
        ("hypothesis", p.hypothesis),
        ("expected", p.expected_effect),
        ("risk", p.risk),
        ("cost", p.estimated_cost),
        ("llm", llm_summary(p.notes)),
    ]
    return [(k, v or "-") for k, v in rows if v or k not in ("llm", "coupled")]


def waits_for_a_person(p: ProposalRecord, flag: str) -> str:
    """``proposal 24 of round 6 waits for a person: knob 7 → 5 (optuna); decide with …``:
    a queued proposal, its change and the commands that decide it (``flag``: the profile's
    option, `` --profile PATH``, or empty), as ``status`` and the waiting round say it."""
    return (
        f"proposal {p.id} of round {p.round_id} waits for a person: "
        f"{p.change.describe()} ({p.source}); decide with "
        f"`orchestrate proposals approve {p.id}{flag}` or "
        f"`orchestrate proposals veto {p.id} --reason TEXT{flag}`"
    )


def approve_edited(
    ledger: Ledger,
    proposal: ProposalRecord,
    context: ProposalContext,
    value: object,
    *,
    cluster: str | None = None,
) -> ProposalRecord:
    """``proposal`` approved with a person's ``value`` instead of the one proposed (the ``ask``
    prompt's ``edit``, ``orchestrate proposals approve N --value V``): validated against the
    knob's domain and the profile's forbidden combinations (``KnobSpace.change``) and allowed
    now (``context.refusal``: not decided under this champion, not vetoed, not known-bad);
    the value proposed kept in its notes (``EDITED_FROM``: the experiment's description says
    the edit) and its hypothesis marked as the proposer's, about the value proposed.

    Raises:
        KnobError: a coupled move (approved or vetoed as proposed), a value out of the
            knob's domain, the champion's own, a forbidden result, or a change refused now.
        LedgerError: the proposal is no longer pending, or another ``cluster``'s.
    """
    if proposal.coupled_knob is not None:
        raise KnobError(
            "a coupled move is approved or vetoed as proposed: its second knob's value "
            "is the one its failure asks for (veto it, and propose a one-knob change)",
            knob=proposal.knob,
        )
    change = context.space.change(context.champion, proposal.knob, value)
    refusal = context.refusal(change)
    if refusal is not None:
        # a person is told what lifts a region (a veto's words name its own experiment)
        lifts = (
            "; `orchestrate known-bad list` names the experiment that barred it, and "
            "`orchestrate known-bad clear N --reason TEXT` lets it run again"
            if refusal.kind == "known-bad"
            else ""
        )
        raise KnobError(refusal.reason + lifts, knob=proposal.knob)
    proposed = as_text(proposal.new_value)
    return ledger.decide_proposal(
        proposal.id,
        status=ProposalStatus.APPROVED,
        by=edited_by(),
        new_value=change.new,
        hypothesis=f"edited by a person from {proposed} to {as_text(change.new)}; the "
        f"proposer's hypothesis, about {proposed}: {proposal.hypothesis}",
        notes={**proposal.notes, EDITED_FROM: proposed},
        cluster=cluster,
    )


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
        max_timeouts: int = 3,
        poll_s: float = 0.5,
        on_queued: Callable[[ProposalRecord], None] = lambda _p: None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        """``queue_timeout_s`` (queue mode): how long a proposal may wait for a person;
        ``on_timeout``: then ``veto`` or ``approve`` it; ``max_timeouts``: timeout vetoes in a
        row before the round stops; ``on_queued``: told once of each proposal the queue waits
        on (``waits_for_a_person``). ``clock`` and ``sleep`` pace the queue's polling.

        Raises:
            UsageError: an unknown mode or timeout action, a timeout that is not positive, or
                ``ask`` without a terminal to ask at.
        """
        if mode not in ("auto", "ask", "queue"):
            raise UsageError(f"--approve {mode!r}: use auto, ask or queue")
        if mode == "ask" and asker is None:
            raise UsageError(
                "--approve ask needs a terminal to answer at, and stdin is none (nohup, cron, "
                "a service); use --approve queue and answer with `orchestrate proposals "
                "approve|veto ID`"
            )
        if on_timeout not in ("veto", "approve"):
            raise UsageError(f"queue timeout action {on_timeout!r}: use veto or approve")
        if queue_timeout_s is not None and queue_timeout_s <= 0:
            raise UsageError(f"queue timeout {queue_timeout_s:g}s: must be positive")
        if max_timeouts < 1:
            raise UsageError(f"max_timeouts {max_timeouts}: must be at least 1")
        self.ledger = ledger
        self.mode = mode
        self.asker = asker
        self.queue_timeout_s = queue_timeout_s
        self.on_timeout = on_timeout
        self.max_timeouts = max_timeouts
        self.poll_s = poll_s
        self._clock = clock
        self._sleep = sleep
        self._timeouts_in_a_row = 0
        self._on_queued = on_queued

    def decide(self, proposal: ProposalRecord, context: ProposalContext) -> ProposalRecord:
        """The decided proposal (approved, possibly with an edited value, or vetoed).

        ``ask`` re-asks until an edited value validates (``KnobSpace.change``) and is allowed
        now (``context.refusal``); ``queue`` polls the ledger until a person decides or the
        timeout does.

        Raises:
            NobodyDeciding: the timeout vetoed ``max_timeouts`` proposals in a row.
            LedgerError: the ledger failed.
        """
        if proposal.status != ProposalStatus.PENDING:
            return proposal
        if self.mode == "auto":
            return self.ledger.decide_proposal(
                proposal.id, status=ProposalStatus.APPROVED, by="auto"
            )
        if self.mode == "ask":
            return self._ask(proposal, context)
        return self._wait(proposal)

    def _ask(self, proposal: ProposalRecord, context: ProposalContext) -> ProposalRecord:
        assert self.asker is not None
        problem: str | None = None
        while True:
            answer = self.asker(proposal, problem)
            if answer.action == "approve":
                return self.ledger.decide_proposal(
                    proposal.id, status=ProposalStatus.APPROVED, by=person()
                )
            if answer.action == "veto":
                reason = (answer.reason or "").strip() or "vetoed at the prompt"
                return self.ledger.decide_proposal(
                    proposal.id, status=ProposalStatus.VETOED, by=person(), reason=reason
                )
            if answer.action == "edit":
                try:
                    return approve_edited(self.ledger, proposal, context, answer.value)
                except KnobError as e:
                    problem = e.message
                    continue
            problem = f"unknown answer {answer.action!r}: approve, edit or veto"

    def _wait(self, proposal: ProposalRecord) -> ProposalRecord:
        timeout = self.queue_timeout_s
        deadline = None if timeout is None else self._clock() + timeout
        self._on_queued(proposal)
        while True:
            current = self.ledger.proposal(proposal.id)
            if current.status != ProposalStatus.PENDING:
                self._timeouts_in_a_row = 0
                return current
            if timeout is not None and deadline is not None and self._clock() >= deadline:
                return self._time_out(proposal, timeout)
            self._sleep(self.poll_s)

    def _time_out(self, proposal: ProposalRecord, timeout: float) -> ProposalRecord:
        status = ProposalStatus.APPROVED if self.on_timeout == "approve" else ProposalStatus.VETOED
        try:
            decided = self.ledger.decide_proposal(
                proposal.id,
                status=status,
                by=TIMEOUT_BY,
                reason=f"no decision within {timeout:g}s (the profile's on_timeout: "
                f"{self.on_timeout})",
            )
        except LedgerError:
            # a person decided in the instant between the last poll and the timeout
            current = self.ledger.proposal(proposal.id)
            if current.status == ProposalStatus.PENDING:
                raise
            self._timeouts_in_a_row = 0
            return current
        if status == ProposalStatus.APPROVED:
            self._timeouts_in_a_row = 0
            return decided
        self._timeouts_in_a_row += 1
        if self._timeouts_in_a_row >= self.max_timeouts:
            raise NobodyDeciding(
                f"{self._timeouts_in_a_row} proposals in a row were vetoed by the queue's "
                f"{timeout:g}s timeout: nobody is deciding, so the round is paused; run the "
                "same command to resume once someone can decide (a change the timeout vetoed "
                "may be proposed again), or set the profile's approve.timeout_s longer or "
                "approve.on_timeout: approve",
                timeouts=self._timeouts_in_a_row,
                timeout_s=timeout,
                decided=decided,
            )
        return decided
