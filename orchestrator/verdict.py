"""Verdicts: keep, discard, inconclusive, invalid — or ask for more evidence.

A candidate is measured on one or more boots; each boot's objective is the sum over the
profile's cells of decode tok/s. The champion has its own boots. ``assess`` compares them:

1. invalid — greedy outputs differ from the champion's (speculative decoding is lossless, so a
   difference is a bug however fast it is), or a node's clocks were off while measuring;
2. guardrails — errors, or a TTFT p90 regression beyond the profile's limit (in percent, and
   more than a few milliseconds: ``ttft_p90_min_increase_ms``): discard (``guardrails``: a
   cell whose window a busy host stalled judges no guardrail, and the verdict says so);
3. the gain ``δ = log(candidate / champion)``: with a spike-and-slab prior (a share
   ``prior_null`` of changes do nothing; the rest spread ``prior_effect_pct``; a one-knob
   change is judged with its knob's ``effect_prior`` when the knob spec declares one) and the
   observed mean log ratio ``g ~ N(δ, se²)`` whose ``se`` comes from the noise model (and
   what a busy host's stalls may have cost the readings: ``host_stalls``, which also makes a
   keep and either discard hold at the least and most favourable readings the stalls allow),
   ``P(δ > 0 | g)`` and ``P(δ > equivalence | g)`` follow in closed form (``posterior``).
   Where the acceptance counters say what the change does (``Evidence.acceptance``,
   ``orchestrator.acceptance``), the null is that: the spike sits at their shift. The prior
   makes the posterior honest whatever rule decided to take another boot, so one rule serves
   every look:
   - P(δ > 0) ≥ confidence: ``confirm`` until ``confirm_boots`` fresh boots were added (with
     the champion re-measured), then ``keep``;
   - P(δ > equivalence) < futility: ``discard`` (clearly worse, or not worth it);
   - at ``max_boots``, with the champion as well measured as the candidate: ``inconclusive``;
   - the chance that the boots left bring P(δ > 0) to the confidence (the predictive
     probability of a keep, Bayesian sequential trials' futility rule) below
     ``predictive_futility``: ``discard`` — a keep is out of reach, another boot is waste;
   - otherwise ``more``: another boot — of the champion when it has fewer boots than the
     candidate (``balance_boots``: the difference's error shrinks fastest on the side with
     fewer boots, and the champion's boots serve every later verdict), else of the candidate.
     A value looked at before under this champion (``pooling``) counts its earlier looks' boots
     on its side: while they outweigh the champion's, the champion is booted (up to
     ``BALANCE_LOOKS`` × ``max_boots``) before the predictive futility may give the change up
     — no boot of the candidate reduces the champion's error, which every pooled contrast
     shares.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Literal

from knobs.records import CellResultRecord
from knobs.spec import EffectPrior, Value
from knobs.vocabulary import Status, Undecided
from orchestrator.acceptance import NullSource
from orchestrator.greedy import fingerprint_mismatch, irreproducible, unchecked_cells
from orchestrator.guardrails import guard
from orchestrator.host_stalls import SAID, HostError
from orchestrator.noise import NoiseModel
from orchestrator.posterior import Posterior, Prior, posterior, predictive_keep
from orchestrator.profile_sections import VerdictSpec

if TYPE_CHECKING:
    from orchestrator.pooling import Pooled

#: A value looked at again balances the champion against all its looks' boots (pooled), up
#: to this many times ``max_boots`` champion boots (``policy.FAIR_TRIAL``: when a value has
#: had enough boots that further looks cannot decide it).
BALANCE_LOOKS = 3


def objective(cells: Sequence[CellResultRecord]) -> float:
    """The objective over measured cells: decode tok/s summed over cells (repeats of a cell
    count as their mean)."""
    by_cell: dict[str, list[float]] = {}
    for cell in cells:
        by_cell.setdefault(cell.cell, []).append(cell.output_throughput)
    return sum(sum(v) / len(v) for v in by_cell.values())


def accept_len(cells: Sequence[CellResultRecord]) -> float | None:
    """Mean accepted tokens per verify step over the cells that report it."""
    values = [c.accepted_per_step for c in cells if c.accepted_per_step is not None]
    return sum(values) / len(values) if values else None


def slow_ranks(cells: Sequence[CellResultRecord], min_matmul_rate: float) -> list[int]:
    """Nodes whose clocks were off (matmul rate below ``min_matmul_rate``) in any of ``cells``:
    such a measurement measures the node, not the config."""
    return sorted(
        {c.rank for cell in cells for c in cell.clocks if c.matmul_rate < min_matmul_rate}
    )


@dataclass(frozen=True)
class Evidence:
    """What a verdict looks at: per-boot objectives and the cells behind them."""

    candidate: Sequence[float]
    champion: Sequence[float]
    confirmations: int
    candidate_cells: Sequence[CellResultRecord]
    champion_cells: Sequence[CellResultRecord]
    min_matmul_rate: float = 0.9
    #: the null where the acceptance counters say what the change does (``champion.null``):
    #: the log ratio and its standard error; ``None``: the null is "nothing"
    acceptance: tuple[float, float] | None = None
    #: whence that null: ``counters`` (their shift) or ``draft law`` (less the step cost)
    null_from: NullSource = "counters"
    #: what the counters alone say (``acceptance_shift``), recorded whether or not it is the
    #: null (the step cost learns from it); ``None`` where the cells report no acceptance
    counters: tuple[float, float] | None = None
    #: the champion's value of the changed knob
    held: Value | None = None
    #: the cells of every champion boot the verdict weighs, for the greedy check (a prompt
    #: whose text the champion did not reproduce judges nothing); empty: ``champion_cells``
    champion_texts: Sequence[CellResultRecord] = ()
    #: per boot of each side, what its hosts' stalls may have cost its objective, relative
    #: (``host_stalls.boot_error``); empty: nothing stalled
    candidate_stalls: Sequence[float] = ()
    champion_stalls: Sequence[float] = ()


#: Whose boot an undecided verdict wants next.
NextBoot = Literal["candidate", "champion"]


@dataclass(frozen=True)
class Assessment:
    """``keep | discard | inconclusive | invalid`` (final) or ``more | confirm`` (boot again;
    ``next_boot`` says whose, for ``more``). ``policy.next_action`` turns it into a step."""

    status: Status | Undecided
    rule: str
    reason: str
    stats: dict[str, object] = field(default_factory=dict)
    next_boot: NextBoot | None = None

    @property
    def final(self) -> bool:
        """Whether this decides the experiment."""
        return not isinstance(self.status, Undecided)


def _mean_log(values: Sequence[float]) -> float:
    return sum(math.log(v) for v in values) / len(values)


def _validity(spec: VerdictSpec, ev: Evidence, stats: dict[str, object]) -> Assessment | None:
    texts = ev.champion_texts or ev.champion_cells
    mismatch = fingerprint_mismatch(ev.candidate_cells, texts) if spec.check_greedy else []
    if mismatch:
        return Assessment(
            Status.INVALID,
            "greedy-mismatch",
            f"greedy outputs differ from the champion's on {len(mismatch)} prompt(s): "
            + ", ".join(mismatch[:5]),
            {**stats, "mismatched_prompts": mismatch},
        )
    slow = slow_ranks(ev.candidate_cells, ev.min_matmul_rate)
    if slow:
        return Assessment(
            Status.INVALID,
            "clocks",
            "clocks were off during the measurement on node(s) " + ", ".join(map(str, slow)),
            {**stats, "slow_ranks": slow},
        )
    unchecked = unchecked_cells(ev.candidate_cells, texts) if spec.check_greedy else []
    if unchecked:
        return Assessment(
            Status.INCONCLUSIVE,
            "greedy-unchecked",
            f"greedy outputs could not be compared on {len(unchecked)} cell(s), no prompt "
            "finished on both sides with a text the champion reproduced: "
            + ", ".join(unchecked[:5])
            + (
                " (the champion's own greedy texts differ between its runs in every cell: "
                "verdict.check_greedy: false, if this engine's texts depend on more than the "
                "config)"
                if irreproducible(texts)
                else ""
            ),
            {**stats, "unchecked_cells": unchecked},
        )
    return None


def _pooled_words(pooled: Pooled) -> str:
    """What a verdict pooled, in words: the value's own earlier looks (a second look) apart from
    the knob's other values."""
    others = pooled.values - (1 if pooled.same else 0)
    words = [f"its earlier look(s) at this value ({pooled.same} boot(s))"] if pooled.same else []
    if others:
        words.append(f"{others} other value(s) of the knob ({pooled.boots - pooled.same} boots)")
    return " and ".join(words)


def _ahead(pooled: Posterior) -> Prior:
    """What the other values' evidence (``Pooled.prior``) is to the candidate's own boots."""
    return Prior(p_null=1.0 - pooled.p_effect, sd=pooled.sd, mean=pooled.mean)


def worse(g: float, se: float) -> bool:
    """The posterior's "worse": the change measured more than a standard error below the
    champion (``g``: log ratio of the objectives, ``se`` its standard error)."""
    return g < -se


def assess(
    spec: VerdictSpec,
    ev: Evidence,
    noise: NoiseModel,
    prior: EffectPrior | None = None,
    pooled: Pooled | None = None,
) -> Assessment:
    """The verdict on the evidence so far (or a request for another boot).

    ``prior``: what is known about the changed knob's effect (its spec's ``effect_prior``);
    ``None``, or ``spec.knob_priors`` off: the profile's ``prior_null`` / ``prior_effect_pct``.
    ``pooled``: the change's effect given the other values of its knob measured against the
    same champion too (``pooling``); it decides in place of the change's own boots alone.
    """
    if not ev.candidate or not ev.champion:
        raise ValueError("a verdict needs at least one boot of candidate and champion")
    cand, champ = objective_of(ev.candidate), objective_of(ev.champion)
    delta_pct = (cand / champ - 1.0) * 100.0
    stats: dict[str, object] = {
        "objective": cand,
        "champion_objective": champ,
        "delta_pct": delta_pct,
        "candidate_boots": len(ev.candidate),
        "champion_boots": len(ev.champion),
        "confirmations": ev.confirmations,
        "boot_cv": noise.boot_cv,
    }
    invalid = _validity(spec, ev, stats)
    if invalid is not None:
        return invalid
    guarded = guard(spec, ev.candidate_cells, ev.champion_cells)
    if guarded.unjudged:  # a cell whose window a busy host stalled: the verdict says so
        stats["ttft_unjudged"] = {k: round(s, 2) for k, (s, _) in guarded.unjudged.items()}
    if guarded.breach is not None:
        b = guarded.breach
        verdict = Assessment(Status.DISCARD, b.rule, b.reason, {**stats, **b.stats})
    elif spec.policy == "threshold":
        status = Status.KEEP if delta_pct > spec.threshold_pct else Status.DISCARD
        relation = ">" if status == Status.KEEP else "not >"
        verdict = Assessment(
            status,
            "threshold",
            f"{delta_pct:+.2f}% vs champion ({relation} +{spec.threshold_pct:g}%, one run)",
            stats,
        )
    else:
        verdict = _sequential(spec, ev, noise, prior, stats, pooled)
    said = guarded.words()
    return replace(verdict, reason=f"{verdict.reason}; {said}") if said else verdict


def _sequential(
    spec: VerdictSpec,
    ev: Evidence,
    noise: NoiseModel,
    prior: EffectPrior | None,
    stats: dict[str, object],
    pooled: Pooled | None = None,
) -> Assessment:
    """The sequential policy: the posterior of the gain decides, or asks for another boot."""
    knob_prior = prior is not None and spec.knob_priors
    if prior is None or not spec.knob_priors:
        prior = EffectPrior(p_null=spec.prior_null, effect_pct=spec.prior_effect_pct)
    prior_sd = math.log1p(prior.effect_pct / 100)
    g = _mean_log(ev.candidate) - _mean_log(ev.champion)
    # what a busy host may have cost the readings widens their error (``host_stalls``)
    host = HostError.of(ev.candidate_stalls, ev.champion_stalls)
    noise_se = noise.se(len(ev.candidate), len(ev.champion))
    se = math.hypot(noise_se, host.se)
    if pooled is not None and host.disturbed:
        pooled = None  # the other values' boots would pass the host's reading off as the knob's
    spike, spike_sd = ev.acceptance if ev.acceptance is not None else (0.0, 0.0)
    # what the boots still to come update: the knob's prior, or the other values' evidence
    ahead = Prior(p_null=prior.p_null, sd=prior_sd, spike=spike, spike_sd=spike_sd)
    post = posterior(g, se, ahead)
    if pooled is not None:
        stats.update(
            own_p_gain=post.p_above(0.0),
            pooled_values=pooled.values,
            pooled_boots=pooled.boots,
            pooled_p_effect=pooled.posterior.p_effect,
        )
        post = pooled.posterior
        ahead = _ahead(pooled.prior)
    # the other values' evidence at the least and the most favourable readings their stalls
    # allow (``pooling``): the reading itself where none of them stalled
    least = ahead if pooled is None or pooled.least is None else _ahead(pooled.least)
    most = ahead if pooled is None or pooled.most is None else _ahead(pooled.most)
    others = pooled.bound if pooled is not None else 0.0
    equivalence = math.log1p(spec.equivalence_pct / 100)
    p_gain = post.p_above(0.0)
    p_worth = post.p_above(equivalence)
    # a keep must hold at the least favourable reading the stalls allow, a discard at the
    # most favourable: a reading its host may have made decides nothing either way; pooled,
    # the reading updates the other values' evidence at its own least and most favourable
    # (``least``, ``most``), as the boots to come update it
    leaning = host.bound > 0 or least is not ahead or most is not ahead
    keep_p, discard_p = (
        host.judged(g, noise_se, (least, most), equivalence, p_gain, p_worth)
        if leaning
        else (p_gain, p_worth)
    )
    stats.update(
        g=g,
        se=se,
        p_gain=p_gain,
        p_worth=p_worth,
        prior_null=prior.p_null,
        prior_effect_pct=prior.effect_pct,
        prior_from="knob" if knob_prior else "profile",
        # the posterior itself, for what comes after the verdict (a second look weighs it)
        post_p_effect=post.p_effect,
        post_mean=post.mean,
        post_sd=post.sd,
    )
    if host.se > 0 or others > 0:
        stats.update(host.stats(noise_se, keep_p, discard_p))
    if others > 0:
        stats.update(pooled_stall_bound=others)
    if ev.counters is not None:
        stats.update(counters_shift=ev.counters[0], counters_se=ev.counters[1])
    if ev.held is not None:
        stats.update(from_value=ev.held)
    if ev.acceptance is not None:  # the null was the counters' shift (less the step cost)
        law = ev.null_from == "draft law"
        stats.update(
            {
                ("law_shift" if law else "acceptance_shift"): spike,
                ("law_se" if law else "acceptance_se"): spike_sd,
                "post_spike": post.spike,
                "post_spike_sd": post.spike_sd,
            }
        )
    where = (
        f"{stats['delta_pct']:+.2f}% over {len(ev.candidate)} measurement(s) "
        f"vs {len(ev.champion)}; "
        f"P(gain)={p_gain:.2f}, P(gain>{spec.equivalence_pct:g}%)={p_worth:.2f}"
    )
    if pooled is not None:  # whose P(gain) it is: the knob's values', and the value's own
        where += (
            f" pooled with {_pooled_words(pooled)}; this value's boots alone: "
            f"P(gain)={stats['own_p_gain']:.2f}"
        )
    if host.said:
        where += host.words(keep_p, discard_p, spec.equivalence_pct)
    if others >= SAID:
        where += (
            f", the other values' boots stalled too (their readings may be off by up to "
            f"{others * 100:.1f}%"
            + (
                ")"
                if host.said
                else f": P(gain)={keep_p:.2f} at their least favourable, "
                f"P(gain>{spec.equivalence_pct:g}%)={discard_p:.2f} at their most)"
            )
        )
    if ev.acceptance is not None:
        what = "counters less the step cost" if ev.null_from == "draft law" else "counters"
        where += (
            f", its acceptance {what} say {math.expm1(spike) * 100:+.1f}% (±{spike_sd * 100:.1f}%)"
        )
    if keep_p >= spec.confidence:
        if ev.confirmations >= spec.confirm_boots:
            return Assessment(Status.KEEP, "posterior", f"{where}: confirmed gain", stats)
        return Assessment(Undecided.CONFIRM, "posterior", f"{where}: promising, confirming", stats)
    if discard_p < spec.futility:
        why = "worse" if worse(g, se) else "not worth a change"
        return Assessment(Status.DISCARD, "posterior", f"{where}: {why}", stats)
    side = len(ev.candidate) + (pooled.same if pooled is not None else 0)
    stats.update(value_boots=side)
    return _more_or_stop(
        spec,
        noise,
        most,
        g + host.bound,
        len(ev.candidate),
        len(ev.champion),
        where,
        stats,
        side=side,
    )


def _more_or_stop(
    spec: VerdictSpec,
    noise: NoiseModel,
    ahead: Prior,
    g: float,
    n: int,
    m: int,
    where: str,
    stats: dict[str, object],
    *,
    side: int,
) -> Assessment:
    """Undecided by the posterior: inconclusive at the boot cap, a discard when a keep is out
    of reach within it (predictive futility), else another boot and whose. ``g``: the reading
    at its most favourable that the hosts' stalls allow (the reading itself where none
    stalled)."""
    balance_to = max(spec.max_boots, min(side, BALANCE_LOOKS * spec.max_boots))
    champion_more = max(0, balance_to - m) if spec.balance_boots else 0
    if n >= spec.max_boots and champion_more == 0:
        return Assessment(
            Status.INCONCLUSIVE,
            "max-boots",
            f"{where}: undecided after {spec.max_boots} boots",
            stats,
        )
    if spec.balance_boots and side > spec.max_boots and m < balance_to:
        # looked at again: the candidate's side outweighs the champion's, whose error every
        # pooled contrast shares; its boots come before the change is given up
        stats.update(next_boot="champion")
        reason = f"{where}: undecided over {side} boots of this value, the champion measured again"
        return Assessment(Undecided.MORE, "posterior", reason, stats, next_boot="champion")
    reach = predictive_keep(
        g,
        noise.boot_cv,
        n,
        m,
        max(0, spec.max_boots - n),
        champion_more=champion_more,
        prior=ahead,
        confidence=spec.confidence,
    )
    stats.update(p_reach=reach)
    if reach < spec.predictive_futility:
        return Assessment(
            Status.DISCARD,
            "futility",
            f"{where}: P(a keep within {spec.max_boots} boots)={reach:.2f}, not worth another "
            "boot in this look",
            stats,
        )
    if spec.balance_boots and m < min(n, spec.max_boots):
        stats.update(next_boot="champion")
        reason = f"{where}: undecided, the champion measured again"
        return Assessment(Undecided.MORE, "posterior", reason, stats, next_boot="champion")
    stats.update(next_boot="candidate")
    reason = f"{where}: undecided, another boot"
    return Assessment(Undecided.MORE, "posterior", reason, stats, next_boot="candidate")


def interval_pct(stats: Mapping[str, object], z: float) -> tuple[float, float] | None:
    """The change's interval of ``z`` standard errors, percent, from what its verdict recorded:
    the posterior's ``g`` and ``se`` where it ran; else, for a verdict decided before it (a
    guardrail, the threshold policy's one run), the log ratio it measured (``objective`` vs
    ``champion_objective``) with the noise model's ``boot_cv`` it recorded, over the
    measurements it weighed (``NoiseModel.se``). ``None`` where it recorded neither (a
    baseline, a crash, a veto, a release that recorded no noise)."""
    g, se = stats.get("g"), stats.get("se")
    if not _number(g) or not _number(se):
        cand, champ = stats.get("objective"), stats.get("champion_objective")
        cv, n, m = (stats.get(k) for k in ("boot_cv", "candidate_boots", "champion_boots"))
        if not all(_number(v) for v in (cand, champ, cv, n, m)):
            return None
        assert isinstance(cand, int | float) and isinstance(champ, int | float)
        assert isinstance(cv, int | float) and isinstance(n, int) and isinstance(m, int)
        if cand <= 0 or champ <= 0:
            return None
        g, se = math.log(cand / champ), NoiseModel(float(cv), 0.0, 0, 0).se(n, m)
    assert isinstance(g, int | float) and isinstance(se, int | float)
    if se <= 0:
        return None
    return math.expm1(g - z * se) * 100, math.expm1(g + z * se) * 100


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def objective_of(per_boot: Sequence[float]) -> float:
    """The geometric mean of per-boot objectives (what the verdict compares)."""
    return math.exp(_mean_log(per_boot))
