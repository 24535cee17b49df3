"""A value judged with its neighbours: the other values of an ordered knob measured against the
same champion are evidence about this one.

One boot scatters ~5 %, so one value's own boots cannot tell a +6 % change from nothing within
the boots a verdict may spend. But the values of an ordered knob (K, MNBT, a memory fraction)
are not unrelated: when K 5 → 4, 3, 2 and 1 each measured +4 % against the same champion, the
knob's effect below 5 is not a coin toss for any of them. The model, on the log scale:

- every trusted boot of the champion measures ``μ + ε``, every boot of value ``u`` measures
  ``μ + δ(u) + ε``, ``ε ~ N(0, cv²)``; ``μ`` is unknown (flat), so the data are the contrasts
  ``g_u = ȳ_u − ȳ₀`` with covariance ``cv²·(diag(1/n_u) + J/m)``: every contrast shares the
  champion's mean error, and a champion measured low by chance lifts them all alike — which
  the model knows, so it does not count that lift once per value;
- spike: the knob does nothing under this champion, ``δ ≡ 0`` (prior ``π``, the knob's
  learned prior); slab: ``δ`` is a Gaussian process over the value's position in the knob's
  domain (0 … 1), squared-exponential with spread ``τ`` (the knob's learned prior) and length
  scale ``ℓ``, conditioned on ``δ(champion's value) = 0``. ``ℓ`` is not assumed: each of
  ``LENGTHS`` is weighted by how well it explains the data, from nearly independent values to
  a knob whose effect is one smooth trend, so a knob whose neighbours disagree is judged value
  by value. Nor is it assumed that the trend runs through the champion: each length scale
  comes twice, once smooth across the champion's value and once with the two sides
  independent (a kink at the champion), weighted alike. A champion is where a search stopped,
  often at a peak or a cliff's edge: MNBT below it past a time-to-first-token cliff (−10 %)
  says, under a smooth trend, that MNBT above it gains; the values above, measured flat or
  worse, then weigh for the kink, and each side is judged by its own values.

A boot's hosts may have stalled its windows (``host_stalls``): the error that adds to its log
objective adds to its value's mean's variance (and the champion's, to the shared term), as in
the boot's own verdict; a boot the host disturbed is not pooled (``host_stalls.reusable``).
A pooled keep, and a pooled discard, must hold at the least and the most favourable reading
the stalls allow, as an unpooled one (``HostError.judged``): the candidate's own reading moved
by its boots' bound and the champion's, updating the other values' evidence read at its least
and most favourable too (``Pooled.least``, ``Pooled.most``: each other value's contrast moved
by its boots' bound and the champion's). Where nothing stalled, nothing changes.

A knob without an order (CUDA graphs, a KV dtype) has unrelated values: they share only the
spike and the champion's error, and a value looked at again (``policy.second_look``) pools all
its looks' boots — exactly as one experiment with every boot would be judged.

Everything is Gaussian, so ``P(the knob matters)``, and the candidate's ``δ`` under the slab,
come in closed form (the slab a mixture over ``ℓ``, moment-matched). The pooled posterior
decides; the boots still to come (predictive futility) update the others' evidence alone, the
candidate's own boots treated as independent of it (an approximation: they share the
champion's error). No other value measured: nothing to pool, the verdict's per-value model
decides. The pooled changes leave the knob's learned prior (``priors``), which would otherwise
count them twice.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from knobs.spec import KnobSpec, Value
from orchestrator.host_stalls import side_bound, side_error
from orchestrator.posterior import Posterior

#: Length scales of the slab's Gaussian process, in units of the knob's whole domain.
LENGTHS = (0.04, 0.12, 0.3, 0.8)
#: The length scale of a knob whose values have no order (CUDA graphs, a KV dtype): its values
#: are unrelated, and only a value measured again (a second look) pools its boots.
UNRELATED = 1e-3
_JITTER = 1e-10


@dataclass(frozen=True)
class ValueBoots:
    """A value of the knob and the log objectives of its trusted boots under the champion, with
    what each boot's hosts' stalls may have cost it (``host_stalls.boot_error``, relative; empty:
    nothing stalled), which adds to its error as in the verdict (``host_stalls.side_error``)."""

    value: Value
    logs: tuple[float, ...]
    errors: tuple[float, ...] = ()

    def stalls(self) -> tuple[float, ...]:
        """Each boot's stall error (0 where none was recorded)."""
        return self.errors or (0.0,) * len(self.logs)


@dataclass(frozen=True)
class Pooled:
    """The candidate's effect given every measured value of its knob (``posterior``) and given
    the other values only (``prior``: what the candidate's own boots update)."""

    posterior: Posterior
    prior: Posterior
    values: int  # other values pooled
    boots: int  # their boots
    same: int = 0  # of them, the boots of the candidate's own value (its earlier looks)
    #: ``prior`` at the least and the most favourable readings the pooled boots' stalls allow
    #: (each other value's contrast moved by its boots' bound and the champion's:
    #: ``host_stalls.side_bound``), for a keep and a discard to hold at, as the candidate's
    #: own reading is moved (``HostError.judged``); ``None``: none of them stalled
    least: Posterior | None = None
    most: Posterior | None = None
    #: the most the stalls may have moved another value's mean (its boots' ``side_bound``)
    bound: float = 0.0


def position(spec: KnobSpec, value: Value) -> float | None:
    """Where ``value`` lies in the knob's domain, 0 … 1, in order for an ordered knob, else in
    the domain's listing (None: not in the domain)."""
    domain = spec.domain()
    if len(domain) < 2:
        return None
    if spec.ordered:
        numbers = sorted(float(v) for v in domain if isinstance(v, int | float))
        if not isinstance(value, int | float) or isinstance(value, bool):
            return None
        x = float(value)
        index = min(range(len(numbers)), key=lambda i: abs(numbers[i] - x))
        if not math.isclose(numbers[index], x, rel_tol=1e-9, abs_tol=1e-9):
            return None
        return index / (len(numbers) - 1)
    for index, v in enumerate(domain):
        if type(v) is type(value) and v == value:
            return index / (len(domain) - 1)
    return None


def pool(
    spec: KnobSpec,
    champion_value: Value,
    champion_logs: Sequence[float],
    candidate: ValueBoots,
    others: Sequence[ValueBoots],
    *,
    boot_cv: float,
    p_null: float,
    tau: float,
    champion_errors: Sequence[float] = (),
) -> Pooled | None:
    """The candidate's pooled effect; None when there is nothing to pool (no other value with
    a boot, a value off the domain, no champion boot). The values of a knob without an order
    are unrelated: they share only the spike (whether the knob does anything here) and the
    champion's error, and the same value measured before pools its boots. A boot's stall error
    (``ValueBoots.errors``; the champion's: ``champion_errors``) adds to its mean's variance as
    the verdict adds it (``host_stalls.side_error``); a boot a busy host disturbed is left out
    by the caller (``host_stalls.reusable``)."""
    x0 = position(spec, champion_value)
    xc = position(spec, candidate.value)
    if x0 is None or xc is None or not champion_logs or not candidate.logs:
        return None
    merged: dict[float, list[float]] = {}
    stalls: dict[float, list[float]] = {}
    for vb in others:
        x = position(spec, vb.value)
        if x is not None and x != x0 and vb.logs:
            merged.setdefault(x, []).extend(vb.logs)
            stalls.setdefault(x, []).extend(vb.stalls())
    if not merged:
        return None
    prior_points = sorted(merged)
    shapes = (
        [(length, kink) for length in LENGTHS for kink in (False, True)]
        if spec.ordered
        else [(UNRELATED, False)]
    )
    champion = (champion_logs, champion_errors)
    prior = _fit(prior_points, merged, stalls, xc, x0, champion, boot_cv, p_null, tau, shapes)
    bounds = [side_bound(stalls[x]) for x in prior_points]
    leaning = any(bounds) or side_bound(champion_errors) > 0
    least, most = (
        (
            _fit(prior_points, merged, stalls, xc, x0, champion, boot_cv, p_null, tau, shapes, -1),
            _fit(prior_points, merged, stalls, xc, x0, champion, boot_cv, p_null, tau, shapes, 1),
        )
        if leaning
        else (None, None)
    )
    both = {x: list(v) for x, v in merged.items()}
    both.setdefault(xc, []).extend(candidate.logs)
    both_stalls = {x: list(v) for x, v in stalls.items()}
    both_stalls.setdefault(xc, []).extend(candidate.stalls())
    posterior = _fit(
        sorted(both), both, both_stalls, xc, x0, champion, boot_cv, p_null, tau, shapes
    )
    return Pooled(
        posterior=posterior,
        prior=prior,
        values=len(merged),
        boots=sum(len(v) for v in merged.values()),
        same=len(merged.get(xc, [])),
        least=least,
        most=most,
        bound=max(bounds),
    )


def _kernel(xs: np.ndarray, ys: np.ndarray, length: float) -> np.ndarray:
    return np.asarray(np.exp(-0.5 * ((xs[:, None] - ys[None, :]) / length) ** 2))


def _conditioned(xs: np.ndarray, x0: float, length: float, kink: bool) -> np.ndarray:
    """The kernel over ``xs`` given ``δ(x0) = 0``; with ``kink``, the two sides of ``x0``
    independent."""
    k = _kernel(xs, xs, length)
    k0 = _kernel(xs, np.array([x0]), length)[:, 0]
    out = k - np.outer(k0, k0)
    if kink:
        side = np.sign(xs - x0)
        out = out * (side[:, None] == side[None, :])
    return np.asarray(out)


def _fit(
    points: list[float],
    boots: dict[float, list[float]],
    stalls: dict[float, list[float]],
    xc: float,
    x0: float,
    champion: tuple[Sequence[float], Sequence[float]],
    cv: float,
    p_null: float,
    tau: float,
    shapes: Sequence[tuple[float, bool]],
    lean: int = 0,
) -> Posterior:
    """The spike-and-slab posterior of ``δ(xc)`` given the contrasts at ``points``, the slab
    a mixture over ``shapes`` (a length scale, and whether the curve has a kink at ``x0``).
    ``stalls``: each point's boots' stall errors; ``champion``: its log objectives and theirs.
    ``lean``: −1 or 1, each contrast read at the least or the most favourable reading its
    stalls and the champion's allow (``host_stalls.side_bound``); 0, as measured."""
    champion_logs, champion_errors = champion
    champ = float(np.mean(champion_logs))
    m = len(champion_logs)
    g = np.array([float(np.mean(boots[x])) - champ for x in points])
    if lean:
        shared = side_bound(champion_errors)
        g = g + lean * np.array([side_bound(stalls.get(x, ())) + shared for x in points])
    n = np.array([len(boots[x]) for x in points], dtype=float)
    noise = cv**2 * (np.diag(1.0 / n) + np.full((len(points), len(points)), 1.0 / m))
    own = np.array([side_error(stalls.get(x, ())) for x in points])
    shared = side_error(champion_errors)
    if own.any() or shared:  # what the hosts' stalls may have cost the means, as the verdict
        noise = noise + np.diag(own**2) + shared**2
    xs = np.array([*points, xc])
    log_null = _log_density(g, noise)
    logs, means, variances = [], [], []
    for length, kink in shapes:
        k = tau**2 * _conditioned(xs, x0, length, kink)
        kpp, kcp, kcc = k[:-1, :-1], k[-1, :-1], k[-1, -1]
        cov = kpp + noise + _JITTER * np.eye(len(points))
        logs.append(_log_density(g, cov))
        solved = np.linalg.solve(cov, kcp)
        means.append(float(solved @ g))
        variances.append(max(float(kcc - kcp @ solved), _JITTER))
    log_slab = float(np.logaddexp.reduce(logs)) - math.log(len(shapes))
    pi = min(max(p_null, 1e-6), 1 - 1e-6)
    log_odds = math.log1p(-pi) + log_slab - math.log(pi) - log_null
    p_effect = 1.0 / (1.0 + math.exp(-log_odds)) if log_odds > -700 else 0.0
    w = np.exp(np.array(logs) - max(logs))
    w /= w.sum()
    mean = float(w @ np.array(means))
    var = float(w @ (np.array(variances) + (np.array(means) - mean) ** 2))
    return Posterior(p_effect=p_effect, mean=mean, sd=math.sqrt(var))


def _log_density(x: np.ndarray, cov: np.ndarray) -> float:
    """log N(x; 0, cov)."""
    sign, logdet = np.linalg.slogdet(cov)
    if sign <= 0:
        return -math.inf
    return float(-0.5 * (x @ np.linalg.solve(cov, x) + logdet + len(x) * math.log(2 * math.pi)))
