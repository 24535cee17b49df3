"""The decision rules ``bench/frontier.py`` sweeps, and the noisy replays they are judged on.

Each judged change gets ``reps`` replays of ``MAX_BOOTS`` boots (common random numbers for every
rule): a boot reads the change's true log-effect plus N(0, σ²), the champion's level known
exactly. A rule turns a change's replays into its keep probability and expected boots;
``Judge.point`` turns those into the three rates, all together and per landscape.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

Floats = npt.NDArray[np.float64]
Bools = npt.NDArray[np.bool_]

MAX_BOOTS = 10
#: the grid of the sample mean (log effect) the Bayes rules are computed on
STEP = 0.002
LOW, HIGH = -0.7, 0.46


@dataclass
class Changes:
    """The changes the keep rule judges, and the decisions settled before it."""

    effect: Floats  # true effect, % (judged changes)
    landscape: list[str]
    settled: dict[str, int]  # per landscape: decisions a crash, a check or a guardrail made
    loop: dict[str, float]  # the loop's own counts on the same decisions

    @property
    def gain(self) -> Bools:
        return self.effect >= 5.0

    @property
    def wrong(self) -> Bools:
        return self.effect <= 0.0


@dataclass
class Point:
    """One rule's reach: pooled, and per landscape."""

    family: str
    params: dict[str, float]
    boots: float
    miss: float
    wrong: float
    per_landscape: dict[str, tuple[float, float, float]] | None = None

    def row(self) -> dict[str, Any]:
        return {
            "family": self.family,
            "params": self.params,
            "boots_per_decision": round(self.boots, 4),
            "miss_rate": round(self.miss, 4),
            "wrong_keep_rate": round(self.wrong, 5),
        }


class Judge:
    """Noisy boots of every judged change (common random numbers for every rule) and the
    arithmetic that turns a rule's keep probabilities and boots into the three rates."""

    def __init__(self, changes: Changes, sigma: float, reps: int, seed: int) -> None:
        self.changes = changes
        self.sigma = sigma
        self.d = np.log1p(changes.effect / 100)
        rng = np.random.default_rng(seed)
        draws = self.d[:, None, None] + sigma * rng.standard_normal((len(self.d), reps, MAX_BOOTS))
        self.means = np.cumsum(draws, axis=2) / np.arange(1, MAX_BOOTS + 1)
        self.names = sorted(changes.settled)
        self.groups = {n: np.array([w == n for w in changes.landscape]) for n in self.names}
        self.sel = np.stack([np.ones(len(self.d), bool), *self.groups.values()]).astype(float)
        self.gains = self.sel * changes.gain
        self.wrongs = self.sel * changes.wrong
        self.settled = np.array(
            [sum(changes.settled.values()), *(changes.settled[n] for n in self.names)], float
        )
        self.decisions = self.sel.sum(axis=1) + self.settled

    def rates(self, keep: Floats, boots: Floats) -> Floats:
        """Rows (all, then each landscape) of (boots per decision, miss rate, wrong keeps per
        decision); ``keep`` and ``boots``: each change's keep probability and expected boots."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.stack(
                [
                    (self.sel @ boots + self.settled) / self.decisions,
                    1 - (self.gains @ keep) / self.gains.sum(axis=1),
                    (self.wrongs @ keep) / self.decisions,
                ],
                axis=1,
            )

    def point(self, family: str, params: dict[str, float], keep: Floats, boots: Floats) -> Point:
        r = self.rates(keep, boots).tolist()
        per = {n: (v[0], v[1], v[2]) for n, v in zip(self.names, r[1:], strict=True)}
        return Point(family, params, r[0][0], r[0][1], r[0][2], per)


def fixed_rules(judge: Judge) -> list[Point]:
    out = []
    for n in range(1, MAX_BOOTS + 1):
        mean = judge.means[:, :, n - 1]
        boots = np.full(len(mean), float(n))
        for t in np.arange(-2.0, 12.01, 0.25):
            keep = (mean >= math.log1p(t / 100)).mean(axis=1)
            out.append(judge.point("fixed", {"n": n, "t": round(float(t), 2)}, keep, boots))
    return out


def two_stage_rules(judge: Judge) -> list[Point]:
    """Every (lo, hi, more, t2): P(keep) = P(x1 >= hi) + P(lo <= x1 < hi, mean >= t2), from
    per-change joint tail probabilities, so that the grid costs no more draws."""
    first = judge.means[:, :, 0]
    los = [float(v) for v in np.arange(-3.0, 8.01, 0.5)]
    his = [*(float(v) for v in np.arange(0.0, 16.01, 0.5)), math.inf]
    t2s = [float(v) for v in np.arange(-1.0, 8.01, 0.5)]
    cut = {a: first >= math.log1p(a / 100) for a in {*los, *his} if a != math.inf}
    above = {a: v.mean(axis=1) for a, v in cut.items()}
    above[math.inf] = np.zeros(len(first))
    out = []
    for more in (1, 2):
        mean = judge.means[:, :, more]
        joint: dict[tuple[float, float], Floats] = {}
        for t2 in t2s:
            passed = mean >= math.log1p(t2 / 100)
            for a, v in cut.items():
                joint[a, t2] = (v & passed).mean(axis=1)
            joint[math.inf, t2] = np.zeros(len(first))
        for lo in los:
            for hi in his:
                if hi <= lo:
                    continue
                gray = above[lo] - above[hi]
                boots = 1 + more * gray
                for t2 in t2s:
                    keep = above[hi] + joint[lo, t2] - joint[hi, t2]
                    params = {"lo": lo, "hi": hi, "more": more, "t2": t2}
                    out.append(judge.point("two-stage", params, keep, boots))
    return out


@dataclass
class Prior:
    """A prior on the grid: atoms of log effect (in grid steps), their weights and classes."""

    k: npt.NDArray[np.int64]
    weight: Floats
    wrong: Bools
    gain: Bools

    @staticmethod
    def of(effect: Floats) -> Prior:
        d = np.log1p(effect / 100)
        cls = np.where(effect <= 0, 0, np.where(effect >= 5, 2, 1))
        k = np.round(d / STEP).astype(np.int64)
        keys, counts = np.unique(np.stack([k, cls]), axis=1, return_counts=True)
        return Prior(keys[0], counts / counts.sum(), keys[1] == 0, keys[1] == 2)


class Bayes:
    """Backward induction for one prior: the posterior over its atoms on the grid of the mean
    after n boots (independent of the loss), then a policy per (A, c)."""

    def __init__(self, prior: Prior, sigma: float) -> None:
        self.prior, self.sigma = prior, sigma
        self.i0 = round(LOW / STEP)
        self.m = (self.i0 + np.arange(round((HIGH - LOW) / STEP) + 1)) * STEP
        self.post: list[Floats] = [np.empty(0)]
        for n in range(1, MAX_BOOTS + 1):
            d = prior.k * STEP
            logw = np.log(prior.weight)[None, :] - n * (self.m[:, None] - d[None, :]) ** 2 / (
                2 * sigma**2
            )
            w = np.exp(logw - logw.max(axis=1, keepdims=True))
            self.post.append(w / w.sum(axis=1, keepdims=True))
        self.nodes, self.qw = np.polynomial.hermite_e.hermegauss(24)
        self.qw = self.qw / self.qw.sum()

    def policy(self, a: float, c: float) -> tuple[list[Bools], list[Bools]]:
        """Per n (1..MAX_BOOTS) on the grid: go on (one more boot), and keep when stopping."""
        stop, keep = [np.empty(0)], [np.empty(0, bool)]
        for n in range(1, MAX_BOOTS + 1):
            p_wrong = self.post[n][:, self.prior.wrong].sum(axis=1)
            p_gain = self.post[n][:, self.prior.gain].sum(axis=1)
            keep.append(a * p_wrong < p_gain)
            stop.append(np.minimum(a * p_wrong, p_gain))
        value = stop[MAX_BOOTS]
        go = [np.zeros(len(self.m), bool) for _ in range(MAX_BOOTS + 1)]
        for n in range(MAX_BOOTS - 1, 0, -1):
            # U(j) = E[V_{n+1}((y_j + σ ε) / (n + 1))] on the integer grid y_j = j · STEP
            lo = n * self.i0 + int(self.prior.k.min())
            hi = n * (self.i0 + len(self.m) - 1) + int(self.prior.k.max())
            y = np.arange(lo, hi + 1) * STEP
            points = (y[:, None] + self.sigma * self.nodes[None, :]) / (n + 1)
            u = np.interp(points, self.m, value) @ self.qw
            index = n * (self.i0 + np.arange(len(self.m)))[:, None] + self.prior.k[None, :] - lo
            more = c + (self.post[n] * u[index]).sum(axis=1)
            go[n] = more < stop[n]
            value = np.where(go[n], more, stop[n])
        return go, keep

    def run(self, means: Floats, a: float, c: float) -> tuple[Floats, Floats]:
        """Each change's keep probability and expected boots under the policy for (A, c)."""
        go, keep = self.policy(a, c)
        active = np.ones(means.shape[:2], bool)
        kept = np.zeros(means.shape[:2], bool)
        boots = np.zeros(means.shape[:2])
        for n in range(1, MAX_BOOTS + 1):
            i = np.clip(
                np.round(means[:, :, n - 1] / STEP).astype(np.int64) - self.i0, 0, len(self.m) - 1
            )
            boots += active
            stops = active & ~go[n][i]
            kept |= stops & keep[n][i]
            active &= go[n][i]
        return kept.mean(axis=1), boots.mean(axis=1)


WEIGHTS_A = [float(v) for v in np.geomspace(0.02, 100, 20)]
WEIGHTS_C = [float(v) for v in np.geomspace(2e-4, 0.1, 20)]


Solvers = list[tuple[Bools, Bayes]]


def solvers(judge: Judge, per_landscape: bool) -> Solvers:
    """One Bayes solver for the pooled prior, or one per landscape with its own prior."""
    c = judge.changes
    if per_landscape:
        return [(g, Bayes(Prior.of(c.effect[g]), judge.sigma)) for g in judge.groups.values()]
    return [(np.ones(len(c.effect), bool), Bayes(Prior.of(c.effect), judge.sigma))]


def bayes_run(judge: Judge, parts: Solvers, a: float, cost: float) -> tuple[Floats, Floats]:
    keep, boots = np.zeros(len(judge.d)), np.zeros(len(judge.d))
    for g, rule in parts:
        keep[g], boots[g] = rule.run(judge.means[g], a, cost)
    return keep, boots


def bayes_rules(judge: Judge, family: str, parts: Solvers) -> list[Point]:
    out = []
    for a in WEIGHTS_A:
        for cost in WEIGHTS_C:
            keep, boots = bayes_run(judge, parts, a, cost)
            out.append(judge.point(family, {"A": a, "c": cost}, keep, boots))
    return out


def replay(judge: Judge, p: Point, bayes: dict[str, Solvers]) -> Point:
    """A rule found on one set of draws, run again on ``judge``'s (fresh) draws: the sweep's
    least values are picked from many rules on the same draws, and so read a little low."""
    q = p.params
    if p.family == "fixed":
        n = int(q["n"])
        keep = (judge.means[:, :, n - 1] >= math.log1p(q["t"] / 100)).mean(axis=1)
        boots = np.full(len(judge.d), float(n))
    elif p.family == "two-stage":
        first = judge.means[:, :, 0]
        more = int(q["more"])
        high = first >= math.log1p(q["hi"] / 100)
        gray = (first >= math.log1p(q["lo"] / 100)) & ~high
        late = judge.means[:, :, more] >= math.log1p(q["t2"] / 100)
        keep = (high | (gray & late)).mean(axis=1)
        boots = 1 + more * gray.mean(axis=1)
    else:
        keep, boots = bayes_run(judge, bayes[p.family], q["A"], q["c"])
    return judge.point(p.family, q, keep, boots)
