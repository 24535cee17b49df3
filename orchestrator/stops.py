"""What stopped a round short of its end, recorded for the morning (``round-stopped``): a node
away, a champion that stopped booting, the lease lost, an interrupt (``record_stop``), or the
round's own cap (``record_cap``); ``last_stop`` and ``said_stop`` read it back for
``orchestrate status``, the report and the resume.
"""

from __future__ import annotations

from datetime import datetime

from cluster.errors import NodeError
from knobs.vocabulary import EventKind
from ledger import EventRecord, Ledger, LedgerError
from ledger.redact import Redactor
from orchestrator.busy_host import CLIENT, BusyHost
from orchestrator.errors import INTERRUPTED, OrchestrateError
from orchestrator.faults import InfrastructureFault
from orchestrator.interrupts import ended_by
from orchestrator.timestamps import utc_minute
from orchestrator.unrecorded import StopRecord, held_by_ledger, owe


def record_stop(
    ledger: Ledger,
    cluster: str,
    round_id: int | None,
    err: OrchestrateError | KeyboardInterrupt,
) -> None:
    """What stopped round ``round_id`` short of its end (a node away, a champion that stopped
    booting, the lease lost, an interrupt, a busy host), recorded for the morning
    (``round-stopped``): the line the command ended with went to a terminal or a timer's log;
    ``orchestrate status`` and the resume show it from here. A node's failure names the node
    (``node``, with its ``failure_class``); a busy host's stop names whose host stalled
    (``busy_hosts``: ``client``, the engine's node, or both; the engine's also as ``node``).
    ``round_id`` None: a round command stopped before any round began (``before_a_round``).
    A ledger that is itself what failed records nothing; one that takes no write as the stop
    comes leaves it owed (``unrecorded.owe``): the command keeps it outside the ledger."""
    if isinstance(err, LedgerError):
        return
    detail: dict[str, object]
    if isinstance(err, KeyboardInterrupt):
        by = ended_by(err)
        code, line = INTERRUPTED, f"interrupted by {by}; run the same command again to resume"
        detail = {"error": by.split(" ")[0]}  # which signal, never the exception's class
    else:
        code, line, detail = err.exit_code, err.message, {"error": type(err).__name__}
        failure = err.failure if isinstance(err, InfrastructureFault) else err
        if isinstance(failure, NodeError) and failure.rank is not None:
            detail.update(node=f"node-{failure.rank}", failure_class=failure.failure_class)
        if isinstance(err, BusyHost):  # whose host stalled: the client's, the engine's node's
            detail.update(busy_hosts=err.hosts)
            engine = [h for h in err.hosts if h != CLIENT]
            if engine:
                detail.update(node=engine[0])
    reason = Redactor.from_environment().text(line)
    try:
        ledger.add_event(
            cluster,
            EventKind.ROUND_STOPPED,
            subject="" if round_id is None else str(round_id),
            detail={**detail, "exit_code": code},
            reason=reason,
        )
    except LedgerError as failed:
        # the ledger took no write (read-only, full, away) as the stop came: the round's
        # command keeps it outside the ledger, for `status` and the next round (``unrecorded``)
        if held_by_ledger(failed):
            owe(err, StopRecord(round_id, code, reason, detail))
    else:
        owe(err, None)


#: The exit code of a round stopped by its cap (``--max-hours``, ``--max-gpu-hours``): the
#: command did what it was asked, and the round stays open for the same command to go on.
CAPPED = 0


def record_cap(ledger: Ledger, cluster: str, round_id: int, cap: str, line: str) -> None:
    """Round ``round_id`` stopped by its cap ``cap`` (``max-hours``, ``max-gpu-hours``),
    recorded as any stop short is (``round-stopped``, exit ``CAPPED``) with the line the
    command ended with: ``status`` (and ``--json``), the report, the MLflow parent run's
    ``stops`` and the resume say the cap stopped it and how to go on."""
    ledger.add_event(
        cluster,
        EventKind.ROUND_STOPPED,
        subject=str(round_id),
        detail={"error": "RoundCapReached", "cap": cap, "exit_code": CAPPED},
        reason=line,
    )


def last_stop(ledger: Ledger, cluster: str, round_id: int) -> EventRecord | None:
    """The last time round ``round_id`` stopped short of its end (``record_stop``), if
    nothing has booted for it since (a resume under way, or one that went on, makes it old
    news)."""
    stops = [
        ev for ev in ledger.events(cluster, EventKind.ROUND_STOPPED) if ev.subject == str(round_id)
    ]
    if not stops:
        return None
    booted = [
        b.started_at for e in ledger.experiments(round_id=round_id) for b in ledger.boots(e.id)
    ]
    return None if any(t > stops[-1].created_at for t in booted) else stops[-1]


def said_stop(stop: EventRecord) -> str:
    """A stop (``last_stop``) in words: ``stopped at … UTC (exit N): the line``."""
    return (
        f"stopped at {utc_minute(stopped_at(stop))} "
        f"(exit {stop.detail.get('exit_code')}): {stop.reason}"
    )


def stopped_at(stop: EventRecord) -> datetime:
    """When ``stop`` happened: its record's time, or the time it was kept outside a ledger
    that could not record it then (``unrecorded``: recorded late)."""
    at = stop.detail.get("stopped_at")
    return datetime.fromisoformat(at) if isinstance(at, str) else stop.created_at
