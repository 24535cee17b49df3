"""The verdict's guardrails: errors, and the time to first token (TTFT) p90 of each cell.

A change whose requests fail beyond ``max_error_rate``, or whose TTFT p90 in some cell grows
beyond ``ttft_p90_regression_pct`` (and by more than ``ttft_p90_min_increase_ms``) over the
champion's, is discarded whatever its objective (``verdict.assess``). Each side's readings of a
cell are averaged: the change's boots, and the champion's boots in force (its level, as the
objective is judged on; one boot's p90 is one window's luck).

A latency read from a window its host stalled for seconds measures the host, not the config: a
client off the CPU reads every first token late, an engine's scheduler woken late sends it late.
Such a cell is still kept for the objective (``cluster.bench``: three measurements, the least
stalled kept; setting them all aside would reboot most configs on a busy host), but a reading
whose window is disturbed (``cluster.stall.disturbed``, the one predicate) judges no guardrail,
on either side: the TTFT guardrail compares a cell's undisturbed readings only, and a cell
with none on one side is not judged (``Guarded.unjudged``, said in the verdict's words). So a
busy host never discards a change through the guardrail, nor bars a value through a guardrail
declared monotone (``history.guardrail_region``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from cluster import stall
from knobs.records import CellResultRecord
from knobs.vocabulary import GuardrailRule
from orchestrator.profile_sections import VerdictSpec


@dataclass(frozen=True)
class Breach:
    """A guardrail a change broke: the rule, in words, and what the verdict records of it."""

    rule: GuardrailRule
    reason: str
    stats: dict[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class Guarded:
    """What the guardrails found: a breach or none, and the cells whose TTFT was not judged
    because their windows were disturbed, with the seconds the most stalled one lost and
    whose window it was."""

    breach: Breach | None
    unjudged: dict[str, tuple[float, str]] = field(default_factory=dict)

    def words(self) -> str:
        """The unjudged cells in words (empty when every cell was judged)."""
        return "; ".join(
            f"TTFT guardrail not judged on {name}: {side} window stalled {s:.2f} s by a busy host"
            for name, (s, side) in sorted(self.unjudged.items())
        )


def _undisturbed(
    cells: Sequence[CellResultRecord],
) -> tuple[dict[str, list[float]], dict[str, float]]:
    """Each cell's TTFT p90 readings from undisturbed windows, and each cell's most stalled
    disturbed reading (seconds)."""
    kept: dict[str, list[float]] = {}
    worst: dict[str, float] = {}
    for c in cells:
        lost = stall.stalled(c)
        if stall.disturbed(lost, c.duration):
            worst[c.cell] = max(worst.get(c.cell, 0.0), lost)
        else:
            kept.setdefault(c.cell, []).append(c.p90_ttft_ms)
    return kept, worst


_Side = tuple[dict[str, list[float]], dict[str, float]]


def _unjudged(name: str, mine: _Side, theirs: _Side) -> tuple[float, str] | None:
    """Whether cell ``name``'s TTFT goes unjudged: the seconds its most stalled reading lost
    and whose window it was, where a side has no undisturbed reading of it."""
    if name not in mine[0] and name in mine[1]:
        return mine[1][name], "its"
    if name not in theirs[0] and name in theirs[1]:
        return theirs[1][name], "the champion's"
    return None


#: The fewest requests whose p90 is not simply their slowest one (nearest rank: 0.9 n > n - 1).
P90_REQUESTS = 10


def _few_requests(name: str, readings: Sequence[CellResultRecord]) -> str:
    """What a TTFT breach of cell ``name`` adds where a window it compares completed too few
    requests for a p90 (then its slowest request's): the count, and what reads it better."""
    fewest = min((c.completed for c in readings if c.cell == name), default=P90_REQUESTS)
    if fewest >= P90_REQUESTS:
        return ""
    return (
        f"; a window of it completed only {fewest} request(s), and its p90 is then its slowest "
        f"one's: a longer window (cell {name}'s duration_s) reads it better"
    )


def stalled_breach(
    name: str, candidate: Sequence[CellResultRecord], champion: Sequence[CellResultRecord]
) -> tuple[float, str] | None:
    """Whether a TTFT guardrail breach recorded in cell ``name`` (by any release) rests on a
    window a busy host stalled, by today's rule (``guard``): the stall's seconds and whose
    window it was, where the candidate's readings of it (``candidate``) or the champion's
    (``champion``) have none undisturbed; ``None`` where both sides have one. Such a breach is
    not judged again in the record (a ledger's verdicts are never rewritten), but bars no
    value (``history.guardrail_region``)."""
    return _unjudged(
        name,
        _undisturbed([c for c in candidate if c.cell == name]),
        _undisturbed([c for c in champion if c.cell == name]),
    )


def guard(
    spec: VerdictSpec, candidate: Sequence[CellResultRecord], champion: Sequence[CellResultRecord]
) -> Guarded:
    """The guardrails on a candidate's cells against the champion's."""
    requests = sum(c.completed + c.errors for c in candidate)
    errors = sum(c.errors for c in candidate)
    if requests and errors / requests > spec.max_error_rate:
        samples = [m for c in candidate for m in c.error_samples]
        return Guarded(
            Breach(
                "errors",
                f"{errors} of {requests} requests failed" + (f": {samples[0]}" if samples else ""),
                {"errors": errors, "error_samples": samples[:5]},
            )
        )
    if spec.ttft_p90_regression_pct is None:
        return Guarded(None)
    mine, my_stalls = _undisturbed(candidate)
    theirs, their_stalls = _undisturbed(champion)
    unjudged: dict[str, tuple[float, str]] = {}
    for name in sorted({c.cell for c in candidate} & {c.cell for c in champion}):
        stalled = _unjudged(name, (mine, my_stalls), (theirs, their_stalls))
        if stalled is not None:
            unjudged[name] = stalled
    breach = None
    for name in sorted(mine.keys() & theirs.keys()):
        a = sum(mine[name]) / len(mine[name])
        b = sum(theirs[name]) / len(theirs[name])
        if (
            b > 0
            and (a / b - 1) * 100 > spec.ttft_p90_regression_pct
            and a - b > spec.ttft_p90_min_increase_ms
        ):
            breach = Breach(
                "ttft-guardrail",
                f"TTFT p90 of {name} grew {(a / b - 1) * 100:+.0f}% "
                f"(limit +{spec.ttft_p90_regression_pct:g}%)"
                + _few_requests(name, [*candidate, *champion]),
                {"ttft_cell": name},
            )
            break
    return Guarded(breach, unjudged)
