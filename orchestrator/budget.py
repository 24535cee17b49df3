"""What a round's budget counts: its candidates decided, a vetoed one not among them (a veto
boots nothing, and the next proposal takes its place). The one home of "experiments done"
for the round loop, ``orchestrate status`` and the round's report."""

from __future__ import annotations

from collections.abc import Iterable

from knobs.vocabulary import Kind, State, Status
from ledger import ExperimentRecord


def spends_budget(e: ExperimentRecord) -> bool:
    """Whether ``e`` is one of its round's experiments done against the budget."""
    return e.kind == Kind.CANDIDATE and e.state == State.DECIDED and e.status != Status.VETOED


def done(experiments: Iterable[ExperimentRecord]) -> int:
    """How many of ``experiments`` (a round's) are done against its budget."""
    return sum(1 for e in experiments if spends_budget(e))
