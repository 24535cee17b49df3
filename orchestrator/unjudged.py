"""Decisions nobody made on a value: a failure of the infrastructure's, a closure by the
profile, a veto of the queue's timeout. Each bars nothing, and its change may run again; a
timeout's veto is held for the rest of the sitting that vetoed it (``sitting_start``), so the
queue does not offer it again at once. ``history`` reads them so for every proposer."""

from __future__ import annotations

from datetime import datetime

from knobs.vocabulary import INFRASTRUCTURE, EventKind, Status
from ledger import ExperimentRecord, Ledger, RoundRecord
from orchestrator.approval import TIMEOUT_BY
from orchestrator.closures import CLOSED_RULES


def unjudged(ledger: Ledger, e: ExperimentRecord) -> bool:
    """Whether nobody judged decided ``e``'s value: a failure of the infrastructure's (stuck
    clocks, a node unreachable: ``INFRASTRUCTURE``), a closure by the profile
    (``closures.closure``), a veto of the queue's timeout (``timed_out``). It bars nothing and
    may run again (a timeout's veto once its sitting is over); its history entry says so
    (``HistoryEntry.judged``), so a proposer that tries each value once (a sweep's list)
    has not tried it."""
    return e.failure_class in INFRASTRUCTURE or closed(ledger, e) or timed_out(ledger, e)


def timed_out(ledger: Ledger, e: ExperimentRecord) -> bool:
    """Whether decided ``e`` was vetoed by the queue's timeout (``approve.on_timeout: veto``):
    no one judged its value, so it bars no region, and it is held (not proposed again) only
    for the rest of the sitting that vetoed it (``sitting_start``): a resume, the person
    back, may be offered it again, and a later round or champion always may."""
    if e.status != Status.VETOED:
        return False
    verdict = ledger.verdict(e.id)
    return verdict is not None and verdict.stats.get("by") == TIMEOUT_BY


def sitting_start(ledger: Ledger, rnd: RoundRecord) -> datetime | None:
    """When round ``rnd``'s current run began: its latest resume (``resumes.record``), else
    ``None`` (the round's start)."""
    resumed = [
        ev.created_at
        for ev in ledger.events(rnd.cluster, EventKind.ROUND_RESUMED)
        if ev.subject == str(rnd.id)
    ]
    return max(resumed) if resumed else None


def this_sitting(e: ExperimentRecord, rnd: RoundRecord, sitting: datetime | None) -> bool:
    """Whether ``e`` was decided by round ``rnd``'s current run (``sitting_start``)."""
    if e.round_id != rnd.id:
        return False
    decided = e.decided_at or e.created_at
    return sitting is None or decided >= sitting


def closed(ledger: Ledger, e: ExperimentRecord) -> bool:
    """Whether decided ``e`` was closed by the profile without a verdict (a knob it lost, a
    value outside a domain it narrowed: ``closures.closure``)."""
    if e.status != Status.VETOED:
        return False
    verdict = ledger.verdict(e.id)
    return verdict is not None and verdict.rule in CLOSED_RULES
