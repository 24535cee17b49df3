"""A round command stopped as it claimed the nodes, before its round ran a step: a node away
at the round's start (``lease.Ownership``). Recorded as a stop mid-round is
(``stops.record_stop``, ``round-stopped``, naming the node): under the unfinished round it
would have resumed, else under no round, which ``orchestrate status`` says until a round
begins. Nothing is barred, and the same command goes on once the node is back.
"""

from __future__ import annotations

from typing import Any

from cluster.errors import NodeError
from knobs.vocabulary import EventKind
from ledger import EventRecord, Ledger, LedgerError, RoundRecord
from orchestrator.stops import last_stop, record_stop, stopped_at


def record_away_at_start(
    ledger: Ledger, cluster: str, resumed: RoundRecord | None, err: NodeError
) -> int | None:
    """A round command stopped as it claimed the nodes, before its round ran a step (a node
    away, ``lease.Ownership``), recorded as a stop mid-round is (``record_stop``): under the
    unfinished round it would have resumed (``status``, the report and the resume say it),
    else under no round (``before_a_round``). Nothing is barred, and the same command goes on
    once the node is back. A timer's tries against the same node still away add nothing to
    the stop already recorded (with nothing booted since). The round's id, or None."""
    round_id = None if resumed is None else resumed.id
    try:
        last = (
            before_a_round(ledger, cluster)
            if round_id is None
            else last_stop(ledger, cluster, round_id)
        )
    except LedgerError:  # not read: tried, and kept outside the ledger if it takes no write
        last = None
    said = None if last is None else (last.detail.get("node"), last.detail.get("exit_code"))
    if said != (None if err.rank is None else f"node-{err.rank}", err.exit_code):
        record_stop(ledger, cluster, round_id, err)
    return round_id


def before_a_round(ledger: Ledger, cluster: str) -> EventRecord | None:
    """The last time a round command stopped before any round began (``record_stop`` under no
    round: a node away as it claimed the nodes), if no round has started since."""
    stops = [ev for ev in ledger.events(cluster, EventKind.ROUND_STOPPED) if ev.subject == ""]
    if not stops:
        return None
    started = [r.started_at for r in ledger.rounds(cluster)]
    return None if any(t > stops[-1].created_at for t in started) else stops[-1]


def stop_data(stopped: EventRecord | None) -> dict[str, Any] | None:
    """A stop short (``round-stopped``) for ``status --json``: when, its exit code, its error,
    the node it names (None where no node's failure stopped it), whose host a busy host's stop
    names (``busy_hosts``; None for any other stop), and its line."""
    if stopped is None:
        return None
    return {
        "at": stopped_at(stopped).isoformat(),
        "exit_code": stopped.detail.get("exit_code"),
        "error": stopped.detail.get("error"),
        "node": stopped.detail.get("node"),
        # a busy host's stop: whose host stalled (``client``, the engine's node: ``busy_host``)
        "busy_hosts": stopped.detail.get("busy_hosts"),
        "reason": stopped.reason,
    }
