"""Priors that learn: each knob's effect prior updated by what this cluster measured.

A knob's prior (its spec's ``effect_prior``, else the profile's ``prior_null`` /
``prior_effect_pct``) is a spike-and-slab: a share ``π`` of its changes do nothing, the rest
move the objective by ``δ ~ N(0, τ²)`` on the log scale. Every decided one-knob experiment of
the knob on this cluster measured ``g ~ N(δ, se²)`` (the verdict's ``g`` and ``se``, in the
ledger's verdict stats), so ``g`` has the marginal density ``π·N(0, se²) + (1 − π)·N(0, se² +
τ²)`` and the ledger's changes of the knob give ``(π, τ)`` a posterior (empirical Bayes, on a
grid): the prior's ``π`` as a Beta with ``PRIOR_CHANGES`` changes' worth of pseudo-counts, its
``τ`` as a log-normal as sure as a sample spread over as many changes (``log τ`` with sd
``1/√(2·PRIOR_CHANGES)``). The learned prior is the posterior's mean ``π`` and the slab's
posterior geometric-mean ``τ`` (no evidence: the prior back): a knob the card calls flat that
measures +10 % twice, or −15 %, is judged as a knob that matters; one measured null many times
keeps (or gains) a high ``π``. Only decided experiments count, so the experiment being judged
is never in the prior it is judged with; a failure of the infrastructure's, a crash, an invalid
output, a guardrail or a veto measured no effect and adds nothing; nor does a verdict an
earlier release decided on a busy host's windows (``stalled_verdicts``), nor a change a busy
host left undecided (``busy_host.held``: no look at its value). Today's verdict on
such windows teaches through its ``se``, which their stalls widened (``host_stalls``).

Two priors per knob, from the same changes. What a change of the knob does to the objective
(``knob_priors``, and ``learned_prior``: the proposers' promise, the digest, ``orchestrate
status``, the verdict) learns from each change's ``g``. What it does beyond its acceptance
counters (``learned_prior(beyond=True)``: the prior of a verdict whose null is the counters'
shift, ``orchestrator.acceptance``) learns from ``g`` less that shift: a drafter adapter whose
changes moved the objective by what their counters said is a knob that matters to the proposer,
and one whose counters the verdict may take at their word.

Learned interactions: a knob whose change to one value measured effects under two champions
that differ by more than ``INTERACTION_Z`` standard errors interacts with what changed between
them (the proposer looks at it again when the champion moves).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from knobs.records import CellSpec
from knobs.spec import EffectPrior, Value, as_text
from knobs.vocabulary import INFRASTRUCTURE, MEASURED, State
from ledger import ExperimentRecord, Ledger, VerdictRecord
from orchestrator import knob_renames
from orchestrator.busy_host import held
from orchestrator.profile import Profile
from orchestrator.stalled_verdicts import busy_decided

#: How many changes' worth of evidence the catalog's (or profile's) prior counts as.
PRIOR_CHANGES = 3.0
#: Two measurements of one change under two champions this many standard errors apart: the
#: knob interacts with what changed between the champions.
INTERACTION_Z = 3.0
#: The verdict rules that decide on a measured effect (not a guardrail, not an invalid output):
#: the changes whose effects teach a knob's prior and are pooled as its curve (``pooling``).
MEASURING = frozenset({"posterior", "futility", "max-boots", "threshold"})
_PIS = np.linspace(0.005, 0.995, 100)
_TAUS = np.exp(np.linspace(math.log(0.002), math.log(0.7), 80))


@dataclass(frozen=True)
class Measured:
    """One decided one-knob change: its log effect ``g`` with standard error ``se``, and what its
    acceptance counters said of it (``counters ± counters_se``; 0 where they said nothing)."""

    experiment: int
    knob: str
    value: Value
    champion_key: str
    g: float
    se: float
    counters: float = 0.0
    counters_se: float = 0.0

    @property
    def beyond(self) -> tuple[float, float]:
        """What the change did beyond what its counters account for, with its error: the
        effect the verdict's null (the counters' shift) is weighed against."""
        return self.g - self.counters, math.hypot(self.se, self.counters_se)


def measured(
    ledger: Ledger, experiments: Iterable[ExperimentRecord], cells: Sequence[CellSpec]
) -> list[Measured]:
    """The decided one-knob changes among ``experiments`` whose verdict measured an effect;
    not one an earlier release decided on a busy host's windows (``stalled_verdicts``: its
    effect is the host's as much as the knob's), nor one a busy host left undecided
    (``busy_host.held``: no look at its value). ``cells``: the profile's, which complete a
    measurement."""
    judged: list[tuple[ExperimentRecord, VerdictRecord]] = []
    for e in experiments:
        if (
            e.state != State.DECIDED
            or e.status not in MEASURED
            or e.knob is None
            or e.value is None
            # a coupled move measured two knobs at once: no effect of either alone
            or e.coupled_knob is not None
            or e.failure_class in INFRASTRUCTURE
        ):
            continue
        verdict = ledger.verdict(e.id)
        if verdict is None or verdict.rule not in MEASURING:
            continue
        # a verdict whose boots stalled at all recorded it (``stall_se``): only such a one
        # may be held, and only it reads its measurements again
        if "stall_se" in verdict.stats and held(ledger, e, cells):
            continue
        judged.append((e, verdict))
    busy = busy_decided(ledger, judged)
    out: list[Measured] = []
    for e, verdict in judged:
        effect = _effect(verdict.stats)
        if effect is not None and e.id not in busy:
            assert e.knob is not None and e.value is not None
            out.append(Measured(e.id, e.knob, e.value, e.champion_key or "", *effect))
    return out


def _effect(stats: dict[str, object]) -> tuple[float, float, float, float] | None:
    """``(g, se, counters, counters_se)`` from a verdict's stats: the sequential verdict's own
    (the counters' shift where it recorded one, else 0: a verdict of an older release, or cells
    without counters), else the threshold verdict's delta over its boots' noise; ``None`` when
    the verdict measured no effect (a guardrail, an invalid output)."""
    g, se = stats.get("g"), stats.get("se")
    if isinstance(g, int | float) and isinstance(se, int | float) and se > 0:
        shift, shift_se = stats.get("acceptance_shift"), stats.get("acceptance_se")
        if isinstance(shift, int | float) and isinstance(shift_se, int | float):
            return float(g), float(se), float(shift), float(shift_se)
        return float(g), float(se), 0.0, 0.0
    delta, cv = stats.get("delta_pct"), stats.get("boot_cv")
    n, m = stats.get("candidate_boots"), stats.get("champion_boots")
    numbers = (delta, cv, n, m)
    if not all(isinstance(x, int | float) for x in numbers):
        return None
    assert isinstance(delta, int | float) and isinstance(cv, int | float)
    assert isinstance(n, int | float) and isinstance(m, int | float)
    if delta <= -100 or cv <= 0 or n < 1 or m < 1:
        return None
    return math.log1p(delta / 100), cv * math.sqrt(1 / n + 1 / m), 0.0, 0.0


def learn(
    base: EffectPrior, effects: Sequence[tuple[float, float]], *, changes: int | None = None
) -> EffectPrior:
    """``base`` updated by measured ``(g, se)`` pairs of the knob's changes (see the module).
    ``changes``: how many changes those are, where a change was looked at more than once (each
    look is one pair: the words say so, and the pairs are learned from as they are)."""
    if not effects:
        return base
    pi0 = min(max(base.p_null, 0.01), 0.99)
    tau0 = math.log1p(base.effect_pct / 100)
    a, b = PRIOR_CHANGES * pi0, PRIOR_CHANGES * (1 - pi0)
    log_pi = (a - 1) * np.log(_PIS) + (b - 1) * np.log1p(-_PIS)
    var = _TAUS**2
    # log τ ~ N(log τ0, 1/(2ν)): the spread of a log sample sd over ν observations
    log_tau = -PRIOR_CHANGES * (np.log(_TAUS) - math.log(tau0)) ** 2
    log_post = log_pi[:, None] + log_tau[None, :]
    for g, se in effects:
        null = _log_normal(g, se**2)
        slab = _log_normal(g, se**2 + var)
        log_post = log_post + np.logaddexp(
            np.log(_PIS)[:, None] + null, np.log1p(-_PIS)[:, None] + slab[None, :]
        )
    w = np.exp(log_post - log_post.max())
    w /= w.sum()
    p_null = float((w.sum(axis=1) * _PIS).sum())
    # the slab's spread: the posterior's mean log τ, each (π, τ) weighted by its share 1 − π
    slab = w * (1 - _PIS)[:, None]
    tau = math.exp(float((slab * np.log(_TAUS)[None, :]).sum() / slab.sum()))
    effect_pct = min(100.0, max(0.1, math.expm1(tau) * 100))
    learned = f"{len(effects)} measured change(s)"
    if changes is not None and changes != len(effects):
        learned = f"{len(effects)} look(s) at {changes} measured change(s)"
    source = (
        f"learned from {learned} on this cluster: "
        f"{base.p_null:.0%} null ±{base.effect_pct:.0f}% before, "
        f"{p_null:.0%} null ±{effect_pct:.1f}% now"
    )
    return EffectPrior(p_null=min(p_null, 0.99), effect_pct=effect_pct, source=source)


def _log_normal(x: float, var: float | np.ndarray) -> np.ndarray:
    return np.asarray(-0.5 * x**2 / var - 0.5 * np.log(2 * math.pi * var))


def base_prior(profile: Profile, knob: str) -> EffectPrior:
    """The knob's prior before measuring: its spec's, else the profile's."""
    spec = profile.space.spec(knob)
    if spec.effect_prior is not None:
        return spec.effect_prior
    verdict = profile.verdict
    return EffectPrior(
        p_null=verdict.prior_null,
        effect_pct=verdict.prior_effect_pct,
        source="the profile's prior (the knob's spec declares none)",
    )


def knob_priors(profile: Profile, changes: Sequence[Measured]) -> dict[str, EffectPrior]:
    """Every knob's prior in force: its base prior updated by its measured changes."""
    out: dict[str, EffectPrior] = {}
    for spec in profile.space.knobs:
        looks = [m for m in changes if m.knob == spec.name]
        out[spec.name] = learn(
            base_prior(profile, spec.name), [(m.g, m.se) for m in looks], changes=distinct(looks)
        )
    return out


def learned_prior(
    profile: Profile,
    ledger: Ledger,
    knob: str,
    *,
    excluding: Collection[int] = (),
    beyond: bool = False,
) -> EffectPrior | None:
    """The prior a change of ``knob`` is judged with now (decided experiments only, but those
    ``excluding`` names: evidence the verdict weighs otherwise); ``None`` when its spec declares
    none and nothing was measured (the verdict's profile prior). ``beyond``: of what its
    changes did beyond their acceptance counters (``Measured.beyond``), the prior of a verdict
    whose null is the counters' shift."""
    experiments = knob_renames.experiments(profile.space, ledger, cluster=profile.cluster.name)
    changes = measured(ledger, [e for e in experiments if e.id not in excluding], profile.cells)
    looks = [m for m in changes if m.knob == knob]
    mine = [m.beyond if beyond else (m.g, m.se) for m in looks]
    if not mine and profile.space.spec(knob).effect_prior is None:
        return None
    return learn(base_prior(profile, knob), mine, changes=distinct(looks))


def distinct(looks: Sequence[Measured]) -> int:
    """How many changes ``looks`` are: one value under one champion is one change, however
    many times it was looked at."""
    return len({(as_text(m.value), m.champion_key) for m in looks})


def interacting(changes: Sequence[Measured]) -> frozenset[str]:
    """Knobs whose change to one value measured effects under two champions more than
    ``INTERACTION_Z`` standard errors apart."""
    by_change: dict[tuple[str, str], list[Measured]] = {}
    for m in changes:
        by_change.setdefault((m.knob, as_text(m.value)), []).append(m)
    out: set[str] = set()
    for (knob, _), group in by_change.items():
        for i, x in enumerate(group):
            for y in group[i + 1 :]:
                apart = abs(x.g - y.g) / math.sqrt(x.se**2 + y.se**2)
                if x.champion_key != y.champion_key and apart > INTERACTION_Z:
                    out.add(knob)
    return frozenset(out)
