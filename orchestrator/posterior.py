"""The posterior of a change's gain, and the chance that more boots reach a keep.

The log gain ``δ = log(candidate / champion)`` has a spike-and-slab prior: a share ``p_null``
of changes do nothing (``δ`` at the spike: 0, or what the acceptance counters say the change
does, ``orchestrator.acceptance``), the rest spread ``N(mean, sd²)``. The verdict observes the
mean log ratio ``g ~ N(δ, se²)``; ``posterior`` is the closed form, ``predictive_keep`` the
Bayesian sequential trials' futility rule on it. Pure functions: ``verdict`` decides with
them, ``pooling`` builds its own posterior of the same shape, ``policy`` reads a recorded one
back.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def _phi(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


def _normal_pdf(x: float, sd: float) -> float:
    return math.exp(-0.5 * (x / sd) ** 2) / (sd * math.sqrt(2 * math.pi))


@dataclass(frozen=True)
class Prior:
    """The spike-and-slab prior of a change's log gain: a share ``p_null`` of changes at the
    spike (0, or ``spike`` known to ``± spike_sd``: what the acceptance counters say the change
    does), the rest ``N(mean, sd²)`` (centred on 0 unless other evidence, e.g. ``pooling``'s,
    moved it)."""

    p_null: float
    sd: float
    mean: float = 0.0
    spike: float = 0.0
    spike_sd: float = 0.0


@dataclass(frozen=True)
class Posterior:
    """The posterior of the log gain δ given the observed mean log ratio."""

    p_effect: float  # P(the change does anything)
    mean: float  # of δ given it does something
    sd: float
    #: δ under the null: 0, or what the acceptance counters alone say the change does
    spike: float = 0.0
    spike_sd: float = 0.0

    def p_above(self, threshold: float) -> float:
        """P(δ > threshold)."""
        slab = self.p_effect * (1.0 - _phi((threshold - self.mean) / self.sd))
        return slab + (1.0 - self.p_effect) * _above(self.spike, self.spike_sd, threshold)

    def expected_gain(self) -> float:
        """``E[max(0, δ)]``: what keeping the change would gain, counting a loss as none (what
        one more look at it may still find)."""
        null = (1.0 - self.p_effect) * _positive_part(self.spike, self.spike_sd)
        return self.p_effect * _positive_part(self.mean, self.sd) + null


def _above(mean: float, sd: float, threshold: float) -> float:
    if sd <= 0:
        return float(mean > threshold)
    return 1.0 - _phi((threshold - mean) / sd)


def _positive_part(mean: float, sd: float) -> float:
    """``E[max(0, x)]`` for ``x ~ N(mean, sd²)``."""
    if sd <= 0:
        return max(0.0, mean)
    z = mean / sd
    return sd * _normal_pdf(z, 1.0) + mean * _phi(z)


def posterior(g: float, se: float, prior: Prior) -> Posterior:
    """Spike-and-slab posterior of δ from ``g ~ N(δ, se²)`` under ``prior``."""
    spike, spike_sd = prior.spike, prior.spike_sd
    null = prior.p_null * _normal_pdf(g - spike, math.sqrt(se**2 + spike_sd**2))
    slab = (1.0 - prior.p_null) * _normal_pdf(g - prior.mean, math.sqrt(se**2 + prior.sd**2))
    p_effect = slab / (null + slab) if null + slab > 0 else (1.0 if abs(g - spike) > se else 0.0)
    shrink = prior.sd**2 / (prior.sd**2 + se**2)
    mean = prior.mean + (g - prior.mean) * shrink
    if spike_sd > 0:
        weight = se**2 / (se**2 + spike_sd**2)  # the counters' share of the null's estimate
        spike, spike_sd = spike + (g - spike) * (1 - weight), math.sqrt(weight) * spike_sd
    return Posterior(
        p_effect=p_effect, mean=mean, sd=math.sqrt(shrink) * se, spike=spike, spike_sd=spike_sd
    )


def _p_gain(g: float, se: float, prior: Prior) -> float:
    return posterior(g, se, prior).p_above(0.0)


def predictive_keep(
    g: float,
    boot_cv: float,
    n: int,
    m: int,
    more: int,
    *,
    champion_more: int = 0,
    prior: Prior,
    confidence: float,
) -> float:
    """The predictive probability that ``more`` further candidate boots and ``champion_more``
    further champion boots bring ``P(gain)`` to ``confidence`` (Bayesian sequential designs'
    futility rule: stop when success is out of reach, not only when the gain already looks
    small).

    ``g``: the observed mean log ratio over ``n`` candidate and ``m`` champion boots, each
    boot scattering ``boot_cv``. Given the true gain δ and ``g``, the candidate's mean error is
    ``c·(g - δ) + u`` and the champion's ``(c - 1)·(g - δ) + u``, where
    ``c = (1/n) / (1/n + 1/m)`` and ``u ~ N(0, cv²/(n + m))`` is the part of both errors that
    ``g`` cannot see; the new boots are independent. So the final ratio ``g'`` over
    ``n + more`` and ``m + champion_more`` boots is normal given δ and ``g``, with
    ``E g' = (1 - K)·δ + K·g`` where ``K = c·n/(n + more) + (1 - c)·m/(m + champion_more)``.
    ``P(gain | g')`` rises with ``g'``, so success is ``g' ≥ g*``; over the posterior of δ
    (spike at 0, normal slab) the chance integrates in closed form. Only the last look counts
    (a keep reached on the way is not): the estimate errs on the side of stopping.
    """
    if more <= 0 and champion_more <= 0:
        return 0.0
    more, champion_more = max(0, more), max(0, champion_more)
    var = boot_cv**2
    se_now = math.sqrt(var * (1 / n + 1 / m))
    se_end = math.sqrt(var * (1 / (n + more) + 1 / (m + champion_more)))
    low, high = -1.0, 1.0
    if _p_gain(high, se_end, prior) < confidence:
        return 0.0
    for _ in range(60):
        mid = (low + high) / 2
        if _p_gain(mid, se_end, prior) >= confidence:
            high = mid
        else:
            low = mid
    target = high
    kept = n / (n + more)  # the weight of the boots so far in the final candidate mean
    champion_kept = m / (m + champion_more)
    c = (1 / n) / (1 / n + 1 / m)  # the candidate's share of g's error
    k = c * kept + (1 - c) * champion_kept
    sd_future = math.sqrt(
        var
        * (
            (kept - champion_kept) ** 2 / (n + m)
            + more / (n + more) ** 2
            + champion_more / (m + champion_more) ** 2
        )
    )
    post = posterior(g, se_now, prior)

    def reach(mean: float, spread: float) -> float:
        # g' = (1 - k)·δ + k·g + independent noise, δ ~ N(mean, spread²)
        centre = k * g + (1 - k) * mean
        sd = math.sqrt(sd_future**2 + ((1 - k) * spread) ** 2)
        return 1.0 - _phi((target - centre) / sd) if sd > 0 else float(centre >= target)

    null = reach(post.spike, post.spike_sd)
    return (1 - post.p_effect) * null + post.p_effect * reach(post.mean, post.sd)
