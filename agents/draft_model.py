"""The draft-length model: what a change of K (draft tokens per verify step) will do to the
objective, predicted from the champion's own acceptance counters before any boot.

Speculative decoding accepts ``T(K) = 1 + Σ_{i<K} a_i`` tokens per verify step, ``a_i`` the
share of steps whose draft position ``i`` was accepted (DOMAIN, "Bench cells"); vLLM counts
each position's acceptances (``vllm:spec_decode_num_accepted_tokens_per_pos``) and the bench
client records them per cell. So the champion's cells already say what a step would accept at
every K up to its own: a smaller K drops the tail of the sum; a larger one extends it, each
further position at the ratio the last two fell by (the i.i.d. draft's ``a_0`` per position
when only one is known). A verify step costs more with every draft token, ``step(K) ∝ 1 + γ·K``,
so a cell's throughput at K is

    tok/s(K) = tok/s(K0) · T(K) / T(K0) · (1 + γ·K0) / (1 + γ·K)

and the objective, the sum over cells, follows. ``γ``, one draft token's step cost as a share of
the rest of a step, is fitted to the K changes already measured under this champion (least
squares on the log of the measured ratio, each measurement with a boot's noise, and a prior
``log γ ~ N(log GAMMA_PRIOR, GAMMA_LOG_SD²)``: a step's cost is the stack's, so the prior is
wide and the ledger's measurements move it); K changes measured under earlier champions count
too, at twice the noise (the model reads them with this champion's acceptance); until one is
measured the prior alone. On the twin's
``exl3-tp4`` the prior ranks K=2 and K=3 first from the default K=7, and the truth is K=2
(K=3 is the CUDA-graphs trap there); one measured K change pins ``γ`` to ±0.02.

Pure functions of a ``ProposalContext``: the proposer that uses them stays deterministic and
resumes with nothing to restore.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from agents.context import ChampionCell, ProposalContext
from knobs.config import Change, Config
from knobs.spec import KnobSpec

#: One draft token's verify-step cost as a share of the rest of the step, before any K change
#: is measured: a drafter pass per token of a few ms against a target step of ~50 ms, plus the
#: verify of one more token per request (the twin's EXL3 TP4 stack: 0.07 at one request, 0.1
#: at eight).
GAMMA_PRIOR = 0.07
#: How far ``GAMMA_PRIOR`` may be off (one sd of ``log γ``): calibrated on one stack, while a
#: draft position costs a few percent of a step on one stack and a third on another.
GAMMA_LOG_SD = 1.0
#: The relative sd of one measured change's ratio (a boot's noise, DOMAIN: ±5 %).
RATIO_SD = 0.05
#: The grid the fit searches.
_GAMMAS = tuple(i * 0.0025 for i in range(1, 401))  # 0.0025 … 1


@dataclass(frozen=True)
class DraftPrediction:
    """What the model says of every value of the draft knob, against the champion."""

    knob: str
    #: The champion's K.
    current: int
    #: value → predicted objective change, percent of the champion's.
    change_pct: Mapping[int, float]
    gamma: float
    #: How many K changes measured under this champion the fit rests on (0: the prior alone).
    fitted_on: int

    def best(self) -> int:
        """The value predicted best (the current one when nothing beats it)."""
        best = max(self.change_pct, key=lambda v: (self.change_pct[v], -abs(v - self.current)))
        return best if self.change_pct[best] > 0 else self.current

    def best_of(self, changes: Sequence[Change]) -> Change:
        """The change of the draft knob among ``changes`` predicted best (the first on a tie)."""
        return max(changes, key=lambda c: (self.change_pct[int(c.new)], -changes.index(c)))

    def describe(self, value: int) -> str:
        """``K=2 predicted +18.3 % (γ 0.09 from 1 measured K change)``."""
        how = (
            f"γ {self.gamma:.3f} fitted to {self.fitted_on} measured K change(s)"
            if self.fitted_on
            else f"γ {self.gamma:.3f}, the prior"
        )
        return (
            f"{self.knob}={value} predicted {self.change_pct[value]:+.1f}% from the champion's "
            f"per-position acceptance at {self.knob}={self.current} ({how})"
        )


def draft_knob(context: ProposalContext) -> KnobSpec | None:
    """The knob the profile declares as the draft length (``role: draft_tokens``), if any."""
    for spec in context.space.knobs:
        if spec.role == "draft_tokens":
            return spec
    return None


def predict(context: ProposalContext) -> DraftPrediction | None:
    """The prediction for every value of the draft knob, or ``None`` when the profile declares
    no draft knob or the champion's cells carry no per-position acceptance."""
    spec = draft_knob(context)
    if spec is None:
        return None
    current = context.champion[spec.name]
    if not isinstance(current, int) or isinstance(current, bool) or current < 1:
        return None
    cells = [c for c in context.champion_cells if c.per_position_acceptance]
    if not cells or sum(c.output_throughput for c in cells) <= 0:
        return None
    values = [v for v in spec.domain() if isinstance(v, int) and not isinstance(v, bool)]
    changes = _measured(context, spec.name)
    measured = [(k, r) for base, k, r in changes if base is None]
    elsewhere = [(base, k, r) for base, k, r in changes if base is not None]
    if not any(v != current for v in values):
        return None  # nothing to predict: the knob has one value
    gamma = fit_gamma(cells, current, measured, elsewhere)
    change = {v: (ratio(cells, current, v, gamma) - 1.0) * 100.0 for v in values if v != current}
    return DraftPrediction(spec.name, current, change, gamma, len(changes))


def _measured(context: ProposalContext, knob: str) -> list[tuple[int | None, int, float]]:
    """The measured changes of the draft knob: ``(the champion's K, or None for this champion,
    the K changed to, candidate / champion)``; a change under a champion whose config the
    history does not hold is left out."""
    ks: dict[str, int] = {}
    for e in context.history:
        k = e.config.get(knob)
        if isinstance(k, int) and not isinstance(k, bool):
            ks[Config(e.config).key] = k
    out: list[tuple[int | None, int, float]] = []
    for e in context.history:
        if not (e.knob == knob and e.measured and isinstance(e.value, int)):
            continue
        if e.delta_pct is None or e.delta_pct <= -100.0:
            continue
        here = e.champion_key == context.champion.key
        base = None if here else ks.get(e.champion_key)
        if here or base is not None:
            out.append((base, int(e.value), 1.0 + e.delta_pct / 100.0))
    return out


def accepted(positions: Sequence[float], k: int) -> float:
    """Accepted tokens per step at ``k`` draft tokens from the per-position acceptance measured
    at some K (``positions[i]``: the share of steps with position ``i`` accepted); positions
    beyond those measured continue the last ratio (capped at 1)."""
    rates = [min(1.0, max(0.0, float(a))) for a in positions]
    if k <= len(rates):
        return 1.0 + sum(rates[:k])
    if not rates:
        return 1.0
    last = rates[-1]
    fall = rates[-1] / rates[-2] if len(rates) >= 2 and rates[-2] > 0 else rates[0]
    fall = min(1.0, fall)
    total = 1.0 + sum(rates)
    for _ in range(k - len(rates)):
        last *= fall
        total += last
    return total


def ratio(cells: Sequence[ChampionCell], current: int, k: int, gamma: float) -> float:
    """The objective at ``k`` over the champion's, by the model (see the module)."""
    base = sum(c.output_throughput for c in cells)
    cost = (1.0 + gamma * current) / (1.0 + gamma * k)
    out = 0.0
    for c in cells:
        t0 = accepted(c.per_position_acceptance, current)
        out += c.output_throughput * accepted(c.per_position_acceptance, k) / t0 * cost
    return out / base


def fit_gamma(
    cells: Sequence[ChampionCell],
    current: int,
    measured: Sequence[tuple[int, float]],
    elsewhere: Sequence[tuple[int, int, float]] = (),
) -> float:
    """``γ`` by least squares on the log ratios ``measured`` (value, candidate / champion) and
    ``elsewhere`` (an earlier champion's K, value, ratio; at twice the noise), with the prior;
    the prior alone when nothing is measured."""
    usable = [(current, k, r, 1.0) for k, r in measured if k != current and r > 0]
    usable += [(b, k, r, 2.0) for b, k, r in elsewhere if k != b and r > 0]
    if not usable:
        return GAMMA_PRIOR

    def loss(g: float) -> float:
        fit = sum(
            ((math.log(r) - math.log(ratio(cells, b, k, g))) / w) ** 2 for b, k, r, w in usable
        )
        return fit / RATIO_SD**2 + (math.log(g / GAMMA_PRIOR) / GAMMA_LOG_SD) ** 2

    return min(_GAMMAS, key=loss)
