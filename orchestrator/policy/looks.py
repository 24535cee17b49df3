"""Further looks at a decided change: what a second look promises (``second_look``,
``look_promise``: a change the verdict stopped for want of boots), what a last look promises once
nothing is left untried under the champion (``last_look``), a value's fair trial
(``FAIR_TRIAL``), and whether a discard says its change went too far (``overshot``: a step
back for an ordered knob).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from knobs.vocabulary import GUARDRAIL_RULES
from orchestrator.posterior import Posterior
from orchestrator.profile_sections import VerdictSpec
from orchestrator.verdict import BALANCE_LOOKS, worse

#: A change whose boots over its looks under one champion reach this many times the most the
#: champion is balanced to (``verdict.BALANCE_LOOKS`` × ``max_boots``), still undecided, has
#: had its fair trial: past twice the champion's boots, all the candidate boots there could
#: ever be take off less than a fifth of the comparison's error (the champion's share stays),
#: so further looks would each stop the same way.
FAIR_TRIAL = 2
#: The verdict rules that stop a change for want of boots, not for what it measured.
OUT_OF_BOOTS = frozenset({"futility", "max-boots"})


def look_promise(spec: VerdictSpec, rule: str, stats: Mapping[str, object]) -> float | None:
    """What one more look at a change still promises (``E[max(0, δ)]`` under its verdict's
    posterior, log scale), or None when it gets no other look: only a change the verdict
    stopped for want of boots (``OUT_OF_BOOTS``) whose posterior still promises
    ``second_look_gain_pct``, and not after its fair trial: ``value_boots`` (its boots over
    its looks under this champion) at ``FAIR_TRIAL`` times the most the champion is balanced
    to (``BALANCE_LOOKS`` × ``max_boots``), still undecided. A ledger whose verdicts predate
    the posterior in their stats has none; one whose verdicts predate ``value_boots`` is judged
    by the posterior alone."""
    if rule not in OUT_OF_BOOTS or _trial_spent(spec, stats):
        return None
    gain = _posterior_gain(stats)
    return (
        gain if gain is not None and gain >= math.log1p(spec.second_look_gain_pct / 100) else None
    )


def last_look(
    spec: VerdictSpec, rule: str, stats: Mapping[str, object], looks: int
) -> float | None:
    """What one more look at a decided change promises once nothing is left untried under its
    champion (``history``: the round would end with budget left), or None. The budget a person
    gave goes to the changes the evidence has not settled, the most promising first, whatever
    gain their posteriors still promise: one the verdict stopped for want of boots before its
    fair trial (as ``look_promise``, with no floor), and one it discarded as not worth a change
    (the posterior's rule, not clearly worse: ``verdict.worse``) — at 5 % boot noise a single
    boot closes most changes so, with the champion's level error in every one of them. A
    change looked at more than ``FAIR_TRIAL`` × ``BALANCE_LOOKS`` times under the champion
    (``looks``, this one included) has had its trial; a keep, a discard as worse, a crash or an
    invalid output settles it."""
    if looks > FAIR_TRIAL * BALANCE_LOOKS:
        return None
    if rule in OUT_OF_BOOTS:
        if _trial_spent(spec, stats):
            return None
    elif rule == "posterior":
        g, se = stats.get("g"), stats.get("se")
        if not isinstance(g, int | float) or not isinstance(se, int | float):
            return None
        if worse(float(g), float(se)):
            return None
    else:
        return None
    gain = _posterior_gain(stats)
    return gain if gain is not None and gain > 0 else None


def _trial_spent(spec: VerdictSpec, stats: Mapping[str, object]) -> bool:
    """Whether a value's fair trial is spent: ``value_boots`` (its boots over its looks under
    the champion) at ``FAIR_TRIAL`` times the most the champion is balanced to; a verdict that
    predates ``value_boots`` has not spent it."""
    side = stats.get("value_boots")
    return isinstance(side, int) and side >= FAIR_TRIAL * BALANCE_LOOKS * spec.max_boots


def _posterior_gain(stats: Mapping[str, object]) -> float | None:
    """``E[max(0, δ)]`` under the posterior a verdict's stats carry (log scale), or None when
    they predate it."""
    numbers = [stats.get(k) for k in ("post_p_effect", "post_mean", "post_sd")]
    if not all(isinstance(x, int | float) for x in numbers):
        return None
    p_effect, mean, sd = (float(x) for x in numbers)  # type: ignore[arg-type]
    spike, spike_sd = stats.get("post_spike", 0.0), stats.get("post_spike_sd", 0.0)
    null = (  # the null was the acceptance counters' shift (``orchestrator.acceptance``)
        (float(spike), float(spike_sd))
        if isinstance(spike, int | float) and isinstance(spike_sd, int | float)
        else (0.0, 0.0)
    )
    posterior = Posterior(p_effect=p_effect, mean=mean, sd=sd, spike=null[0], spike_sd=null[1])
    return posterior.expected_gain()


def second_look(
    spec: VerdictSpec, rule: str, stats: Mapping[str, object], looks: int
) -> float | None:
    """What a second look at a change promises (``look_promise``), or None when it gets none:
    looked at ``looks`` times under this champion, fewer than ``1 + second_looks``. A change
    that still promises as much but has no second look left may get a further look
    (``agents.first_looks.further_look``): only when it promises more than the next change
    not yet looked at (on average over the knobs left: TPE's pick)."""
    return look_promise(spec, rule, stats) if looks <= spec.second_looks else None


def open_for(spec: VerdictSpec, rule: str, stats: Mapping[str, object], looks: int) -> str | None:
    """What a change the verdict just stopped for want of boots is open for, in its record's
    words, looked at ``looks`` times under its champion (this look included): ``open for a
    second look (it still promises +1.2%)`` while ``second_look`` gives it one, ``open for a
    further look if it promises more than a change not yet looked at (…)`` once those are
    spent (``look_promise``); ``None`` when no other look is open (the verdict settles the
    change under this champion, until nothing is left untried: ``last_look``). These words
    say the search is not done with the change, so a second look that follows at once reads
    as what it is; and such a change is recorded ``inconclusive`` whichever rule stopped it
    (``experiment``): a futility stop's ``discard`` read as a value barred, in results.tsv and
    MLflow, while nothing was concluded of it (``inconclusive`` is results.tsv's word)."""
    again = second_look(spec, rule, stats, looks)
    if again is not None:
        return f"open for a second look (it still promises {math.expm1(again) * 100:+.1f}%)"
    later = look_promise(spec, rule, stats)
    if later is not None:
        return (
            "open for a further look if it promises more than a change not yet looked at "
            f"(it still promises {math.expm1(later) * 100:+.1f}%)"
        )
    return None


def overshot(rule: str, stats: Mapping[str, object]) -> bool:
    """Whether a discard says its change went too far: past a guardrail (``GUARDRAIL_RULES``),
    or worse than the champion by the posterior (``verdict.worse``). For an ordered knob a
    value between the champion's and this one may still gain: ``agents.first_looks`` gives it
    a look (a step back). "Not worth a change" is no overshoot: a step that far did nothing,
    a shorter one is not expected to do more."""
    if rule in GUARDRAIL_RULES:
        return True
    g, se = stats.get("g"), stats.get("se")
    return (
        rule == "posterior"
        and isinstance(g, int | float)
        and isinstance(se, int | float)
        and worse(float(g), float(se))
    )
