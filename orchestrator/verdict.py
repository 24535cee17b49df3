"""Verdicts: keep, discard, invalid (crash is decided where the boot fails).

Issue #2's rule: keep when the objective beats the champion's by more than the profile's
threshold, unless the candidate is invalid (greedy outputs differ from the champion's, or a
node's clocks were off while it was measured). Issue #5 makes the comparison statistical.
"""

from __future__ import annotations

from collections.abc import Sequence

from knobs.records import CellResultRecord
from ledger.records import VerdictRecord
from orchestrator.profile import Profile


def objective(cells: Sequence[CellResultRecord]) -> float:
    """The profile's objective over measured cells: decode tok/s summed over cells (the mean
    of repeats of the same cell)."""
    by_cell: dict[str, list[float]] = {}
    for cell in cells:
        by_cell.setdefault(cell.cell, []).append(cell.output_throughput)
    return sum(sum(v) / len(v) for v in by_cell.values())


def accept_len(cells: Sequence[CellResultRecord]) -> float | None:
    """Mean accepted tokens per verify step over the cells that report it."""
    values = [c.accepted_per_step for c in cells if c.accepted_per_step is not None]
    return sum(values) / len(values) if values else None


def fingerprint_mismatch(
    candidate: Sequence[CellResultRecord], champion: Sequence[CellResultRecord]
) -> list[str]:
    """Prompt ids whose greedy text differs between candidate and champion."""
    theirs: dict[str, str] = {}
    for cell in champion:
        theirs.update(cell.fingerprints)
    out: list[str] = []
    for cell in candidate:
        for prompt, digest in cell.fingerprints.items():
            if prompt in theirs and theirs[prompt] != digest:
                out.append(prompt)
    return sorted(set(out))


def decide(
    profile: Profile,
    candidate: Sequence[CellResultRecord],
    champion: Sequence[CellResultRecord],
    champion_objective: float,
) -> VerdictRecord:
    """The verdict of a measured candidate against the champion."""
    value = objective(candidate)
    delta = (value / champion_objective - 1.0) * 100.0 if champion_objective > 0 else 0.0
    stats: dict[str, object] = {
        "objective": value,
        "champion_objective": champion_objective,
        "delta_pct": delta,
        "threshold_pct": profile.verdict.threshold_pct,
    }
    mismatch = fingerprint_mismatch(candidate, champion)
    if mismatch:
        return VerdictRecord(
            status="invalid",
            rule="greedy-mismatch",
            reason=f"greedy outputs differ from the champion's on {len(mismatch)} prompt(s): "
            + ", ".join(mismatch[:5]),
            stats={**stats, "mismatched_prompts": mismatch},
        )
    slow = sorted(
        {
            c.rank
            for cell in candidate
            for c in cell.clocks
            if c.matmul_rate < profile.gates.min_matmul_rate
        }
    )
    if slow:
        return VerdictRecord(
            status="invalid",
            rule="clocks",
            reason="clocks were off during the measurement on node(s) " + ", ".join(map(str, slow)),
            stats={**stats, "slow_ranks": slow},
        )
    requests = sum(c.completed + c.errors for c in candidate)
    errors = sum(c.errors for c in candidate)
    if requests and errors / requests > profile.verdict.max_error_rate:
        return VerdictRecord(
            status="discard",
            rule="errors",
            reason=f"{errors} of {requests} requests failed",
            stats={**stats, "errors": errors},
        )
    if delta > profile.verdict.threshold_pct:
        return VerdictRecord(
            status="keep",
            rule="threshold",
            reason=f"objective {value:.1f} is {delta:+.2f}% vs champion {champion_objective:.1f} "
            f"(> +{profile.verdict.threshold_pct:g}%)",
            stats=stats,
        )
    return VerdictRecord(
        status="discard",
        rule="threshold",
        reason=f"objective {value:.1f} is {delta:+.2f}% vs champion {champion_objective:.1f} "
        f"(not > +{profile.verdict.threshold_pct:g}%)",
        stats=stats,
    )
