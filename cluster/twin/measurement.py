"""One noisy measurement of a configuration on a cell, as the bench client would record it.

The simulated testbed's readings (``cluster.simulated``) are these: the landscape's noise-free
truth (``Landscape.truth``) scaled by a boot's speed factor and a run-to-run factor, accepted
draft tokens per step by their own run-to-run factor, and fingerprints that are the greedy texts'
digests of the category's prompts (the trap's differ). This module owns how that noise turns a
truth into a record; ``Landscape.sample`` is its entry point.

Imports the standard library, ``knobs`` and ``cluster.prompts`` only: it runs on every node.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import TYPE_CHECKING

from cluster import prompts
from cluster.twin import noise, text
from knobs.records import CellResultRecord, CellSpec

if TYPE_CHECKING:
    from cluster.twin.landscape import Landscape


def sample(
    landscape: Landscape,
    config: Mapping[str, object],
    cell: CellSpec,
    rng: random.Random,
    boot_factor: float = 1.0,
) -> CellResultRecord | None:
    """One noisy measurement of ``config`` on ``cell`` of ``landscape``; ``None`` when the
    config does not boot.

    Raises:
        KnobError: a value of the wrong type for its knob.
    """
    t = landscape.truth(config, cell)
    if not t.boots:
        return None
    speed = noise.lognormal(rng, landscape.noise.run_to_run) * boot_factor
    acc = noise.lognormal(rng, landscape.noise.acceptance)
    k = len(t.per_position)
    positions = tuple(min(1.0, p * acc) for p in t.per_position)
    accepted = 1.0 + sum(positions)
    scale = (accepted / t.accepted_per_step) * speed
    tok_s = t.output_tok_s * scale
    completed = max(1, round(tok_s * cell.duration_s / cell.max_tokens))
    decode_s = max(t.step_s / speed, 1e-9)
    ttft_ms = t.ttft_s / speed * 1000.0
    trap = t.invalid
    fingerprints = {}
    for i in range(len(prompts.base_prompts(cell.category))):
        p = prompts.build_prompt(cell.category, cell.context_tokens, i)
        fingerprints[p.id] = text.fingerprint(text.greedy_text(p.text, cell.max_tokens, trap=trap))
    return CellResultRecord(
        cell=cell.name,
        category=cell.category,
        concurrency=cell.concurrency,
        context_tokens=cell.context_tokens,
        duration=cell.duration_s,
        completed=completed,
        errors=0,
        total_output_tokens=round(tok_s * cell.duration_s),
        output_throughput=tok_s,
        per_request_throughput=accepted / decode_s,
        mean_ttft_ms=ttft_ms,
        median_ttft_ms=ttft_ms,
        p90_ttft_ms=ttft_ms,
        p99_ttft_ms=ttft_ms,
        median_itl_ms=decode_s * 1000.0,
        effective_concurrency=float(cell.concurrency),
        accepted_per_step=accepted if k else None,
        acceptance_rate=(accepted - 1) / k if k else None,
        per_position_acceptance=positions,
        fingerprints=fingerprints,
    )
