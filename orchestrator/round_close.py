"""A round's close in MLflow, owed until written: the parent run's numbers, the round's report,
results.tsv and the champion's launchers (``cli.round_report.write_round_report``).

They are written once the ledger has closed the round (the report reads it done), so a kill
or an MLflow away between the two left the ledger saying done and the parent run ended with
the numbers of an earlier stop, for good. The ledger records the close as owed before it
closes the round (``owe``, ``round-close-owed``) and as written once MLflow has it
(``written``, ``round-close-written``): ``owed`` is what ``status`` says and the next
``orchestrate round`` writes before it starts.
"""

from __future__ import annotations

from knobs.vocabulary import EventKind, RoundStatus
from ledger import Ledger

_KINDS = (EventKind.ROUND_CLOSE_OWED, EventKind.ROUND_CLOSE_WRITTEN)


def owe(ledger: Ledger, cluster: str, round_id: int) -> None:
    """Round ``round_id``'s close in MLflow is owed: recorded before the ledger closes it."""
    ledger.add_event(cluster, EventKind.ROUND_CLOSE_OWED, subject=str(round_id))


def written(ledger: Ledger, cluster: str, round_id: int) -> None:
    """Round ``round_id``'s close is in MLflow: recorded where it was owed."""
    if round_id in owed(ledger, cluster):
        ledger.add_event(cluster, EventKind.ROUND_CLOSE_WRITTEN, subject=str(round_id))


def owed(ledger: Ledger, cluster: str) -> list[int]:
    """The cluster's rounds done in the ledger whose close MLflow lacks, oldest first (a round
    still open is its resume's to close)."""
    events = sorted(
        (e for kind in _KINDS for e in ledger.events(cluster, kind)), key=lambda e: e.id
    )
    last = {e.subject: e.kind for e in events}  # each round's latest word
    if not any(kind == EventKind.ROUND_CLOSE_OWED for kind in last.values()):
        return []
    done = {str(r.id) for r in ledger.rounds(cluster) if r.status == RoundStatus.DONE}
    return sorted(
        int(subject)
        for subject, kind in last.items()
        if kind == EventKind.ROUND_CLOSE_OWED and subject in done
    )
