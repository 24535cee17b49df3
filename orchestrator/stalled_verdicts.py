"""Verdicts an earlier release recorded from windows a busy host stalled, read by today's rule.

A ledger's verdicts are never rewritten: the record keeps what each said. But a release before
the stall rules read a window a busy host stalled as the config's: its TTFT guardrail
discarded changes at +553 % (``guardrails``), and its objective discarded changes at −45 %
whose true effect is 0 % (``host_stalls``). Today's rule decides what such a record does now,
whatever release wrote it:

- a TTFT guardrail discard whose breach rests on a stalled window (``guardrail_stalled``) bars
  no value through a guardrail declared monotone (``history.guardrail_region``);
- a keep or a discard the objective decided (``posterior``, ``futility``) without weighing the
  stalls of the boots it read (``busy_decided``) measured the host as much as the change. Such
  a discard bars nothing: its change is not decided under its champion and may be proposed
  again (``history``). Neither teaches the knob's learned prior (``priors.measured``): its
  ``g`` and ``se`` are the host's. A keep stays (the champion is what the cluster runs, and
  its level is re-measured on its own boots), and the report's row says how it was decided.

Today's verdict records ``stall_se`` wherever a boot it weighed stalled at all (``HostError``),
so a verdict without it whose boots were disturbed (``host_stalls.disturbed``) was decided
without the rule. Its boots are its own and its champion's (the one held when it was
decided) up to its decision: the champion's may include a boot an earlier cut left out of its
level, which errs towards barring nothing.
"""

from __future__ import annotations

from collections.abc import Iterable

from knobs.records import CellResultRecord
from knobs.vocabulary import State, Status
from ledger import ExperimentRecord, Ledger, VerdictRecord
from orchestrator.guardrails import stalled_breach
from orchestrator.host_stalls import disturbed

#: The verdict rules that decide a keep or a discard on the objective alone.
OBJECTIVE_RULES = frozenset({"posterior", "futility"})
#: What the report's row of such a verdict adds.
WORDS = "decided by an earlier release on windows a busy host disturbed"


def guardrail_stalled(
    ledger: Ledger, e: ExperimentRecord, verdict: VerdictRecord
) -> tuple[float, str] | None:
    """Whether ``e``'s TTFT guardrail discard rests on a window a busy host stalled
    (``guardrails.stalled_breach``), from the readings its record holds: its own of the cell
    that breached, and the champion's latest of it, both from boots before the verdict. An
    earlier release judged such windows; the record keeps what it said, but today's rule
    decides what it bars."""
    cell = verdict.stats.get("ttft_cell")
    if not isinstance(cell, str) or e.decided_at is None:
        return None
    at = e.decided_at

    def readings(experiment: int) -> list[CellResultRecord]:
        before = {b.id for b in ledger.boots(experiment) if b.started_at <= at}
        return [
            r.result
            for r in ledger.cell_results(experiment)
            if r.boot_id in before and r.result.cell == cell
        ]

    held = [c for c in ledger.champion_history(e.cluster) if c.since <= at]
    champion = readings(held[-1].experiment_id)[-1:] if held else []
    return stalled_breach(cell, readings(e.id), champion)


def busy_decided(
    ledger: Ledger, decided: Iterable[tuple[ExperimentRecord, VerdictRecord | None]]
) -> frozenset[int]:
    """The experiments among ``decided`` (each with its verdict) whose keep or discard the
    objective decided without weighing the stalls of boots a busy host disturbed: its own
    boots up to its decision, or its champion's (see the module)."""
    suspects = [
        e
        for e, v in decided
        if e.state == State.DECIDED
        and e.status in (Status.KEEP, Status.DISCARD)
        and e.decided_at is not None
        and v is not None
        and v.rule in OBJECTIVE_RULES
        and "stall_se" not in v.stats
    ]
    out: set[int] = set()
    for cluster in sorted({e.cluster for e in suspects}):
        out |= _busy_decided(ledger, cluster, [e for e in suspects if e.cluster == cluster])
    return frozenset(out)


def _busy_decided(ledger: Ledger, cluster: str, suspects: list[ExperimentRecord]) -> set[int]:
    """``busy_decided`` of one cluster's ``suspects``."""
    by_boot: dict[int, list[CellResultRecord]] = {}
    for readings in ledger.cluster_cell_results(cluster).values():
        for r in readings:
            by_boot.setdefault(r.boot_id, []).append(r.result)
    busy = {boot for boot, cells in by_boot.items() if disturbed(cells)}
    if not busy:
        return set()
    boots = ledger.cluster_boots(cluster)
    champions = ledger.champion_history(cluster)
    out: set[int] = set()
    for e in suspects:
        at = e.decided_at
        assert at is not None
        held = [c.experiment_id for c in champions if c.since <= at and c.experiment_id != e.id]
        weighed = {b.id for x in (e.id, *held[-1:]) for b in boots.get(x, []) if b.started_at <= at}
        if weighed & busy:
            out.add(e.id)
    return out
