"""What the acceptance counters say a change does, apart from the boot-to-boot noise.

A bench cell's throughput is its accepted tokens per verify step over the step's time. Boots of
one config differ by about 5 % (DOMAIN: clocks, memory layout, the rendezvous), and that scatter
is in the step's time: at temperature 0 the drafter proposes, and the target accepts, the same
tokens on every boot, so the counters (``vllm:spec_decode_num_accepted_tokens`` over
``…_num_drafts``) read alike to a fraction of a percent. A change that acts on acceptance alone
(a drafter adapter, a KV dtype's rounding) is then measured by its counters about ten times as
precisely as by its throughput, and the verdict's null (``verdict.posterior``'s spike) is "the
change does what its counters say and nothing more" rather than "nothing".

The counters do not say what the change costs in step time (a bigger adapter drafts slower):
that part is the throughput's to measure, and a reading far from what the counters predict
rules the null out like any other.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from knobs.records import CellResultRecord
from knobs.spec import EffectPrior

#: The least boot-to-boot scatter of the acceptance counters' log (per boot) the verdict assumes,
#: however alike the boots read: greedy decoding accepts the same tokens on every boot, but
#: batching may reorder a step's work.
ACCEPTANCE_CV_FLOOR = 0.005
#: The counters' shift, in its standard errors, from which they say the change moved acceptance.
COUNTED_SIGMAS = 3.0
#: The share of a knob's changes that do nothing beyond their counters (its prior's ``p_null``,
#: as the cluster's measurements taught it) from which the counters' shift is its null.
COUNTED_NULL = 0.5


#: Whence a verdict's null came: the counters' shift alone, or less the step cost (``step_cost``).
NullSource = Literal["counters", "draft law"]


@dataclass(frozen=True)
class Null:
    """A verdict's null where the counters say what a change does: the prior it is judged with
    (its ``p_null`` the spike's weight), the spike (log shift, its error) and whence it came
    (``counters``: their shift alone; ``draft law``: less the step cost, ``step_cost``)."""

    prior: EffectPrior
    spike: tuple[float, float]
    source: NullSource


def moved(shift: tuple[float, float]) -> bool:
    """Whether the counters say the change moved acceptance (``COUNTED_SIGMAS``)."""
    return abs(shift[0]) > COUNTED_SIGMAS * shift[1]


def counts(shift: tuple[float, float], beyond: EffectPrior) -> bool:
    """Whether a change is judged with the counters' shift as its null: they say it moved
    acceptance (``COUNTED_SIGMAS``), and its knob's changes mostly do nothing beyond their
    counters (``beyond``: the knob's prior of that, ``priors.learned_prior(beyond=True)``). A
    draft length, whose every change also moves the step's time, never is (its card prior
    says 5 % of its changes do nothing); a drafter adapter, until this cluster measures its
    changes doing more than their counters say, is."""
    return moved(shift) and beyond.p_null >= COUNTED_NULL


def acceptance_shift(
    candidate: Sequence[Sequence[CellResultRecord]],
    champion: Sequence[Sequence[CellResultRecord]],
) -> tuple[float, float] | None:
    """What the acceptance counters alone say a change does to the objective, and its standard
    error (log scale): per boot, each cell's log accepted tokens per verify step, weighted by
    the cell's share of the champion's objective; the candidate's mean less the champion's.
    ``None`` when a cell of either side reports no acceptance."""
    shares: dict[str, list[float]] = {}
    for boot in champion:
        for c in boot:
            shares.setdefault(c.cell, []).append(c.output_throughput)
    total = sum(sum(v) / len(v) for v in shares.values())
    if total <= 0:
        return None
    weight = {cell: sum(v) / len(v) / total for cell, v in shares.items()}

    def per_boot(boot: Sequence[CellResultRecord]) -> float | None:
        logs: dict[str, list[float]] = {}
        for c in boot:
            if c.accepted_per_step is None or c.accepted_per_step <= 0:
                return None
            logs.setdefault(c.cell, []).append(math.log(c.accepted_per_step))
        if set(logs) != set(weight):
            return None
        return sum(weight[cell] * sum(v) / len(v) for cell, v in logs.items())

    sides = [[per_boot(b) for b in candidate], [per_boot(b) for b in champion]]
    if not all(sides) or any(x is None for side in sides for x in side):
        return None
    cand, champ = ([float(x) for x in side if x is not None] for side in sides)
    squares = sum((x - sum(v) / len(v)) ** 2 for v in (cand, champ) for x in v)
    dof = len(cand) + len(champ) - 2
    var = max(ACCEPTANCE_CV_FLOOR**2, squares / dof if dof > 0 else 0.0)
    shift = sum(cand) / len(cand) - sum(champ) / len(champ)
    return shift, math.sqrt(var * (1 / len(cand) + 1 / len(champ)))
