"""The draft length's verdict null: what its acceptance counters say, less the step cost that
this cluster's K changes taught.

Every change of K (``role: draft_tokens``) moves both halves of a cell's throughput: the tokens
a verify step accepts, which its counters measure to a fraction of a percent (``acceptance``),
and the step's time, which grows with every draft token: ``step(K) ∝ 1 + γ·K`` (DOMAIN, and
``agents.draft_model``, which predicts from the same law before a boot). So a change from
``K0`` to ``K`` does

    δ = counters' shift − c(γ),      c(γ) = log((1 + γ·K) / (1 + γ·K0)),

up to the model's error ``ε ~ N(0, σ²)`` (a prefill-bound cell does not follow its step; a
stack's step may not be linear in K). Every decided K change on this cluster whose counters
were read measured ``g − shift = −c(γ) + ε + e + u``, under whichever champion (the law needs
only the two K's): ``e`` its own boots' error, ``u`` its champion's level error, which every
change measured against that champion shares (a level read high after a keep makes them all
read low: independent errors would put that on ``γ``). So the ledger gives ``(γ, σ)`` a
posterior on a grid, each champion's changes a block of a multivariate normal: ``γ``
log-normal about the draft model's prior (``GAMMA_PRIOR``, ``LAW_GAMMA_LOG_SD``), ``σ``
log-normal about ``MODEL_ERROR`` — what the law misses on a stack is the stack's, and the
ledger's residuals move it. The change being judged then has
the null "it does what its counters and the step cost say": the spike at ``shift − E c``, its
error ``shift_se``, the spread of ``c`` over the posterior and ``E σ²`` together. The slab
(the law broke: a wedge, a regime the law does not know) keeps the knob's own prior. The
proposer's draft-length model predicts with the same posterior of ``γ`` (``StepCost.belief``,
in ``ProposalContext.step_cost``): the one fit of the step cost.

Where other K values were measured against the same champion, the change is judged with them
instead (``pooling``, ``ChampionEvidence.judge``): their readings share the champion's level
error with this one, which pooling models and the law would count twice (on ``far-k``, the
law in their place lost 0.8 to 1.4 points of the optimum over 20 seeds,
docs/benchmarks-history.md).

Until a K change was measured with its counters the law's ``γ`` is the prior's, calibrated on
one stack: no null is offered, the change is judged as any other. Nor where the counters did
not move (``ChampionEvidence.null``): the law's prediction would then be the step cost alone,
which the prior of ``γ`` decides until many K changes are measured (on a stack whose step does
not grow with K, the prior's ``γ`` promised +3 to +5 % for every K change: five changes under
1 % kept in ten runs).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from agents import StepCostBelief
from agents.draft_model import GAMMA_PRIOR, draft_knob
from knobs.space import KnobSpace
from knobs.vocabulary import INFRASTRUCTURE, MEASURED, State
from ledger import ExperimentRecord, Ledger, VerdictRecord
from orchestrator.priors import MEASURING
from orchestrator.stalled_verdicts import busy_decided

#: The law's error per change (one sd of the log effect) before the ledger's residuals say
#: otherwise, and how far it may be off (one sd of its log): a step linear in K describes a
#: decode-bound cell to a percent; prefill-bound cells and engines with other costs miss more.
MODEL_ERROR = 0.01
MODEL_ERROR_LOG_SD = 1.0
#: The share of K changes the law describes to within its error (the spike's weight); the
#: rest are judged by the knob's own prior (the slab).
LAW_HOLDS = 0.8
#: One sd of ``log γ`` about the draft model's ``GAMMA_PRIOR`` (calibrated on one stack): wide,
#: as the verdict decides with it and the proposer predicts with it (``belief``): on a stack
#: whose ``γ`` is five times the prior's, a few K changes must be able to say so.
LAW_GAMMA_LOG_SD = 2.0
_GAMMAS = np.exp(np.linspace(math.log(0.0025), math.log(1.0), 240))
_ERRORS = np.exp(np.linspace(math.log(0.001), math.log(0.3), 40))


@dataclass(frozen=True)
class DraftChange:
    """One decided K change whose counters were read: from ``base`` to ``value``, the effect
    beyond its counters ``residual = g − shift`` and that residual's error (both sides'
    boots and the counters')."""

    base: int
    value: int
    residual: float
    se: float
    #: the champion it was measured against, and the variance of that champion's level
    #: (shared with every change measured against it; part of ``se²``)
    champion: str = ""
    shared: float = 0.0


def step_cost(gamma: float | np.ndarray, base: int, value: int) -> float | np.ndarray:
    """``c(γ)``: the log of the step's time at ``value`` over at ``base``."""
    return np.log1p(gamma * value) - np.log1p(gamma * base)


@dataclass(frozen=True)
class StepCost:
    """The posterior of ``(γ, σ)`` on the grid, from the measured K changes."""

    weights: np.ndarray  # (γ, σ) grid, summing to 1
    changes: int

    @property
    def gamma(self) -> float:
        """The posterior mean of ``γ`` (``belief``'s)."""
        return self.belief().mean

    @property
    def gamma_sd(self) -> float:
        """The posterior sd of ``γ`` (``belief``'s)."""
        return self.belief().sd

    @property
    def error(self) -> float:
        """The root of ``E σ²``: the law's error per change."""
        return math.sqrt(float((self.weights.sum(axis=0) * _ERRORS**2).sum()))

    def belief(self) -> StepCostBelief:
        """``γ``'s marginal, for the proposer's draft-length model (``agents.draft_model``):
        the one fit both sides price a draft token with."""
        w = self.weights.sum(axis=1)
        return StepCostBelief(
            gammas=tuple(float(g) for g in _GAMMAS),
            weights=tuple(float(x) for x in w / w.sum()),
            changes=self.changes,
        )

    def cost(self, base: int, value: int) -> tuple[float, float]:
        """``E c`` and ``Var c`` over the posterior of ``γ``."""
        c = np.asarray(step_cost(_GAMMAS, base, value))
        w = self.weights.sum(axis=1)
        mean = float((w * c).sum())
        return mean, float((w * (c - mean) ** 2).sum())


def fit(changes: Sequence[DraftChange]) -> StepCost:
    """The posterior of ``(γ, σ)`` given ``changes`` (see the module)."""
    log_gamma = -0.5 * ((np.log(_GAMMAS / GAMMA_PRIOR)) / LAW_GAMMA_LOG_SD) ** 2
    log_error = -0.5 * ((np.log(_ERRORS / MODEL_ERROR)) / MODEL_ERROR_LOG_SD) ** 2
    log_post = log_gamma[:, None] + log_error[None, :]
    groups: dict[str, list[DraftChange]] = {}
    for ch in changes:
        groups.setdefault(ch.champion, []).append(ch)
    for group in groups.values():
        log_post = log_post + _block(group)
    w = np.exp(log_post - log_post.max())
    return StepCost(w / w.sum(), len(changes))


def _block(group: Sequence[DraftChange]) -> np.ndarray:
    """The log likelihood on the grid of one champion's changes: residuals ``r_j = −c_j(γ) +
    u + e_j``, ``u ~ N(0, s²)`` shared (the least of their champion level variances: later
    changes saw more of its boots), ``e_j ~ N(0, v_j + σ²)`` their own. Covariance
    ``D + s²·11ᵀ``: by the matrix determinant lemma and Sherman–Morrison,
    ``−½[Σ d_j²/V_j − s²(Σ d_j/V_j)² / (1 + s²Σ 1/V_j) + Σ log V_j + log(1 + s²Σ 1/V_j)]``."""
    shared = min(ch.shared for ch in group)
    quad = np.zeros((len(_GAMMAS), len(_ERRORS)))
    lin = np.zeros_like(quad)
    precision = np.zeros(len(_ERRORS))
    logdet = np.zeros(len(_ERRORS))
    for ch in group:
        d = (ch.residual + np.asarray(step_cost(_GAMMAS, ch.base, ch.value)))[:, None]
        v = max(ch.se**2 - shared, 1e-8) + _ERRORS**2
        quad += d**2 / v[None, :]
        lin += d / v[None, :]
        precision += 1 / v
        logdet += np.log(v)
    inflate = 1 + shared * precision
    return -0.5 * (quad - shared * lin**2 / inflate[None, :] + (logdet + np.log(inflate))[None, :])


def law_null(
    counters: tuple[float, float], base: int, value: int, changes: Sequence[DraftChange]
) -> tuple[float, float] | None:
    """The null of a change from ``base`` to ``value`` draft tokens whose counters read
    ``counters`` (shift, se): ``(spike, spike_sd)``; ``None`` while no K change was measured
    with its counters (the law's ``γ`` would be the prior's)."""
    if not changes or base == value:
        return None
    posterior = fit(changes)
    mean, var = posterior.cost(base, value)
    shift, shift_se = counters
    return shift - mean, math.sqrt(shift_se**2 + var + posterior.error**2)


def learned(
    ledger: Ledger, space: KnobSpace, experiments: Sequence[ExperimentRecord]
) -> StepCost | None:
    """The step cost this cluster's K changes taught: the posterior from every decided change
    of the draft knob among ``experiments`` whose verdict measured an effect with the counters
    read; ``None`` without a draft knob or such a change (``GAMMA_PRIOR`` rules). What
    ``orchestrate status`` shows and the proposer's draft-length model predicts with."""
    spec = draft_knob(space)
    changes = [] if spec is None else draft_changes(ledger, experiments, spec.name, MEASURING)
    return fit(changes) if changes else None


def describe(posterior: StepCost) -> str:
    """``γ 0.21 ± 0.03, the law's error 1.4 % per change, from 5 K change(s)``."""
    return (
        f"γ {posterior.gamma:.3f} ± {posterior.gamma_sd:.3f}, the law's error "
        f"{posterior.error * 100:.1f}% per change, from {posterior.changes} K change(s) "
        "measured with their counters"
    )


def draft_changes(
    ledger: Ledger, experiments: Sequence[ExperimentRecord], knob: str, rules: frozenset[str]
) -> list[DraftChange]:
    """The decided one-knob changes of ``knob`` among ``experiments`` whose verdict (a rule in
    ``rules``: one that measured an effect) recorded the counters' shift and the K it changed
    from (``counters_shift``, ``counters_se``, ``from_value``: verdicts of an older release
    record none, and teach nothing here); its champion's share of its error from the boots'
    scatter over the champion's boots (``boot_cv``, ``champion_boots``). Not one an earlier
    release decided on a busy host's windows (``stalled_verdicts``)."""
    judged: list[tuple[ExperimentRecord, VerdictRecord]] = []
    for e in experiments:
        if (
            e.knob != knob
            or e.state != State.DECIDED
            or e.status not in MEASURED
            or e.coupled_knob is not None
            or e.failure_class in INFRASTRUCTURE
            or not isinstance(e.value, int)
            or isinstance(e.value, bool)
        ):
            continue
        verdict = ledger.verdict(e.id)
        if verdict is not None and verdict.rule in rules:
            judged.append((e, verdict))
    busy = busy_decided(ledger, judged)
    out: list[DraftChange] = []
    for e, verdict in judged:
        if e.id in busy or not isinstance(e.value, int):
            continue
        s = verdict.stats
        keys = ("g", "se", "counters_shift", "counters_se", "boot_cv", "champion_boots")
        numbers = [s.get(k) for k in keys]
        base = s.get("from_value")
        if not all(isinstance(x, int | float) for x in numbers) or not isinstance(base, int):
            continue
        g, se, shift, shift_se, cv, m = (float(x) for x in numbers)  # type: ignore[arg-type]
        if base != e.value and m >= 1:
            residual, error = g - shift, math.hypot(se, shift_se)
            shared = min(cv**2 / m, error**2)
            out.append(DraftChange(base, e.value, residual, error, e.champion_key or "", shared))
    return out
