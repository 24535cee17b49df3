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
the rest of a step, is the stack's, and this model does not fit it: the verdict does
(``orchestrator.step_cost``, from every K change this cluster measured with its counters: the
effect beyond what the counters said is the step cost), and hands its posterior to the proposer
in the context (``ProposalContext.step_cost``). The prediction is the posterior's mean ratio,
so the proposal and the verdict that judges it price a draft token alike, from one fit. Until a
K change is measured, ``GAMMA_PRIOR``, calibrated on one stack: on the twin's ``exl3-tp4`` it
ranks K=2 and K=3 first from the default K=7, and the truth is K=2 (K=3 is the CUDA-graphs trap
there); one measured K change moves it to the stack's (``far-k``: a draft token a third of a
step, five times the prior).

Pure functions of a ``ProposalContext``: the proposer that uses them stays deterministic and
resumes with nothing to restore.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from agents.context import ChampionCell, ProposalContext, StepCostBelief
from agents.proposal import Direction, versus
from knobs.config import Change
from knobs.space import KnobSpace
from knobs.spec import KnobSpec

#: One draft token's verify-step cost as a share of the rest of the step, before any K change
#: is measured: a drafter pass per token of a few ms against a target step of ~50 ms, plus the
#: verify of one more token per request (the twin's EXL3 TP4 stack: 0.07 at one request, 0.1
#: at eight).
GAMMA_PRIOR = 0.07


@dataclass(frozen=True)
class DraftPrediction:
    """What the model says of every value of the draft knob, against the champion."""

    knob: str
    #: The champion's K.
    current: int
    #: value → predicted objective change, percent of the champion's.
    change_pct: Mapping[int, float]
    #: ``γ``'s mean and sd (the prior: sd 0).
    gamma: float
    gamma_sd: float
    #: How many K changes measured with their counters ``γ`` rests on (0: the prior alone).
    fitted_on: int

    def best(self) -> int:
        """The value predicted best (the current one when nothing beats it)."""
        best = max(self.change_pct, key=lambda v: (self.change_pct[v], -abs(v - self.current)))
        return best if self.change_pct[best] > 0 else self.current

    def best_of(self, changes: Sequence[Change]) -> Change:
        """The change of the draft knob among ``changes`` predicted best (the first on a tie)."""
        return max(changes, key=lambda c: (self.change_pct[int(c.new)], -changes.index(c)))

    def expected(self, value: int, direction: Direction) -> str:
        """The expected effect of a change to ``value`` whose value this model picked: its
        prediction, ``better than the champion: K=2 predicted +18.3 % …; a model, not a
        measurement`` (the Optuna and hybrid proposers' K looks alike)."""
        return (
            f"{versus(self.change_pct[value], direction)}: {self.describe(value)}; "
            "a model, not a measurement"
        )

    def describe(self, value: int) -> str:
        """``K=2 predicted +18.3 % … (γ 0.090 ± 0.020 from 1 K change(s) measured …)``."""
        how = (
            f"γ {self.gamma:.3f} ± {self.gamma_sd:.3f} from {self.fitted_on} K change(s) "
            "measured with their counters"
            if self.fitted_on
            else f"γ {self.gamma:.3f}, the prior"
        )
        return (
            f"{self.knob}={value} predicted {self.change_pct[value]:+.1f}% from the champion's "
            f"per-position acceptance at {self.knob}={self.current} ({how})"
        )


def draft_knob(space: KnobSpace) -> KnobSpec | None:
    """The knob the profile declares as the draft length (``role: draft_tokens``), if any."""
    return next((spec for spec in space.knobs if spec.role == "draft_tokens"), None)


def predict(context: ProposalContext) -> DraftPrediction | None:
    """The prediction for every value of the draft knob, or ``None`` when the profile declares
    no draft knob or the champion's cells carry no per-position acceptance."""
    spec = draft_knob(context.space)
    if spec is None:
        return None
    current = context.champion[spec.name]
    if not isinstance(current, int) or isinstance(current, bool) or current < 1:
        return None
    cells = [c for c in context.champion_cells if c.per_position_acceptance]
    if not cells or sum(c.output_throughput for c in cells) <= 0:
        return None
    values = [v for v in spec.domain() if isinstance(v, int) and not isinstance(v, bool)]
    if not any(v != current for v in values):
        return None  # nothing to predict: the knob has one value
    belief = context.step_cost
    points = ((GAMMA_PRIOR, 1.0),) if belief is None else belief_points(belief)
    change = {v: (ratio(cells, current, v, points) - 1.0) * 100.0 for v in values if v != current}
    if belief is None:
        return DraftPrediction(spec.name, current, change, GAMMA_PRIOR, 0.0, 0)
    return DraftPrediction(spec.name, current, change, belief.mean, belief.sd, belief.changes)


def belief_points(belief: StepCostBelief) -> tuple[tuple[float, float], ...]:
    """``belief``'s values of ``γ`` with their weights, those under ``1e-6`` left out."""
    kept = [(g, w) for g, w in zip(belief.gammas, belief.weights, strict=True) if w >= 1e-6]
    total = sum(w for _, w in kept)
    return tuple((g, w / total) for g, w in kept)


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


def ratio(
    cells: Sequence[ChampionCell],
    current: int,
    k: int,
    gammas: Sequence[tuple[float, float]],
) -> float:
    """The objective at ``k`` over the champion's, by the model (see the module), its mean over
    ``gammas`` (``(γ, weight)``, weights summing to 1)."""
    base = sum(c.output_throughput for c in cells)
    tokens = sum(
        c.output_throughput
        * accepted(c.per_position_acceptance, k)
        / accepted(c.per_position_acceptance, current)
        for c in cells
    )
    cost = sum(w * (1.0 + g * current) / (1.0 + g * k) for g, w in gammas)
    return tokens / base * cost
