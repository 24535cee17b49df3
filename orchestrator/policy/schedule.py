"""The champion's schedule: when a re-measurement is due (``remeasure_due``: too few trusted
boots, a keep's boots to test, the drift sentinel's count or age), whether a re-measurement
flags a drift (``suspected_drift``) and whether one more boot confirms it (``drift_confirmed``:
only a confirmed drift re-bases the champion's level), whether a new champion's first boot of
its own says the boots that kept it read high (``keep_boots_inflated``), and how often a
re-measurement with clocks off is taken again.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.profile_sections import VerdictSpec
from orchestrator.verdict import objective_of

#: A champion re-measurement with a node's clocks off is taken this many times in all.
CHAMPION_CLOCK_TRIES = 2
#: A re-measurement this many standard errors off the champion's level is a suspected drift
#: (about 5 % of re-measurements on a cluster that did not drift): the champion is booted once
#: more to confirm it, never re-based on the one boot.
DRIFT_SIGMAS = 2.0
#: A suspected drift is confirmed, and the champion's level re-based, when the boots from the
#: suspicion on, the confirmation boot included, are this many standard errors off the level
#: before them (about 0.3 % two-sided), in the flag's direction.
CONFIRM_SIGMAS = 3.0


def remeasure_due(
    spec: VerdictSpec,
    *,
    trusted_boots: int,
    decided_since: int,
    age_s: float,
    own_boots: int | None = None,
    afresh: bool = False,
    baseline: bool = False,
) -> bool:
    """Whether the champion is measured again before the next proposal.

    A kept change with no trusted boot of its own as champion (``own_boots`` 0; ``None``: the
    round's baseline), at once: the boots that kept it were chosen for reading high, and its
    first boot of its own tests them (``keep_boots_inflated``); one whose keep's boots were set
    aside (``afresh``) with fewer than ``champion_boots`` trusted boots, at once too (a resume
    finishes measuring it afresh). While it has fewer than ``champion_boots`` trusted boots
    (every comparison shares its error: a one-boot champion makes every verdict noisier), after
    each decided experiment — and, under the sequential policy, the round's ``baseline`` (a
    champion no keep made) before its first proposal too: a boot it would take after the first
    verdict anyway, taken first, spares that verdict a level of one boot's luck (a baseline
    that read 9 % high discarded CUDA graphs, +4.8 %, on `sm121-2node`); and — the drift
    sentinel — every ``drift_every`` decided experiments, or when its last measurement is older
    than ``drift_max_age_s``. ``decided_since``: candidates decided since its last boot.
    """
    if keep_test_due(spec, trusted_boots=trusted_boots, own_boots=own_boots, afresh=afresh):
        return True
    old = spec.drift_max_age_s is not None and age_s > spec.drift_max_age_s
    few = trusted_boots < spec.champion_boots
    first = baseline and spec.policy == "sequential"
    return (few and (decided_since >= 1 or first)) or decided_since >= spec.drift_every or old


def keep_test_due(
    spec: VerdictSpec, *, trusted_boots: int, own_boots: int | None, afresh: bool
) -> bool:
    """Whether a kept change's keep is still to be tested (``remeasure_due``'s first two rules):
    it has no trusted boot of its own as champion yet, or its keep's boots were set aside and it
    has fewer than ``champion_boots`` trusted boots. A round ends only once this is false (its
    last keep is tested before it closes: the champion a person finds has a level of its own)."""
    if own_boots == 0 and tests_keep_boots(spec):
        return True
    return afresh and trusted_boots < spec.champion_boots


def drift(before: Sequence[float], after: float, boot_cv: float) -> tuple[float, bool]:
    """The champion's level before a re-measurement (``after`` alone when it had none) and
    whether ``after`` moved from it beyond ``DRIFT_SIGMAS`` standard errors (a flag, to be
    confirmed: ``suspected_drift``)."""
    old = objective_of(before) if before else after
    threshold = DRIFT_SIGMAS * boot_cv * math.sqrt(1.0 + 1.0 / max(1, len(before)))
    significant = abs(math.log(after / old)) > threshold if old > 0 and after > 0 else False
    return old, significant


@dataclass(frozen=True)
class Shift:
    """The champion's per-boot objectives from position ``start`` on against those before it:
    both levels (geometric means) and the difference in standard errors (signed)."""

    start: int
    before: float
    after: float
    sigmas: float


def shift(level: Sequence[float], start: int, boot_cv: float) -> Shift:
    """``level[start:]`` against ``level[:start]`` (both non-empty, every value positive), at
    ``boot_cv`` per boot: the two-sample z of their log means."""
    pre, post = level[:start], level[start:]
    old, new = objective_of(pre), objective_of(post)
    se = boot_cv * math.sqrt(1.0 / len(pre) + 1.0 / len(post))
    sigmas = math.log(new / old) / se if se > 0 else 0.0
    return Shift(start, old, new, sigmas)


def suspected_drift(level: Sequence[float], boot_cv: float, flagged: int | None) -> Shift | None:
    """Whether the champion's latest re-measurement (``level[-1]``; ``level``: its trusted
    per-boot objectives since its last re-base, oldest first) flags a drift, to be confirmed
    with one more boot (``drift_confirmed``).

    Two places the new level may start are screened at ``DRIFT_SIGMAS``: the latest boot, and —
    the sequential part — ``flagged``, the position of the last flag that was not confirmed,
    whose boots a real drift would have moved too (a drift the confirmation missed is caught
    on the boots since, not diluted into the level). The earliest start that flags, if any;
    a start whose boots do not mostly lie on the side of the shift (``_most_agree``) flags
    nothing."""
    starts = sorted({len(level) - 1, *([flagged] if flagged is not None else [])})
    for start in starts:
        if not 0 < start < len(level) or min(level) <= 0:
            continue
        test = shift(level, start, boot_cv)
        if abs(test.sigmas) > DRIFT_SIGMAS and _most_agree(level, test):
            return test
    return None


def tests_keep_boots(spec: VerdictSpec) -> bool:
    """Whether a kept change's boots are tested by its first boot of its own as champion: under
    the sequential policy, whose verdicts compare against the champion's level, unless
    ``keep_boots_sigmas`` is null. The threshold policy (one run against the champion's last,
    the common practice the benchmark's greedy baseline reproduces) never re-measures for it."""
    return spec.policy == "sequential" and spec.keep_boots_sigmas is not None


def keep_boots_inflated(
    spec: VerdictSpec, keep: Sequence[float], fresh: float, boot_cv: float
) -> Shift | None:
    """Whether a new champion's first boot of its own (``fresh``) says that the boots which
    kept it (``keep``: its trusted per-boot objectives as a candidate) read high: ``fresh`` is
    ``keep_boots_sigmas`` standard errors below their level. One-sided: a keep's boots were
    chosen for reading high (the winner's curse), and the level they leave behind judges every
    change after it, so a low first boot of its own sets them aside and the champion is measured
    afresh (``champion_boots`` of its own). The shift from the first boot of its own on, or
    ``None``: they stay in the level."""
    sigmas = spec.keep_boots_sigmas
    if sigmas is None or not tests_keep_boots(spec) or not keep or min(*keep, fresh) <= 0:
        return None
    test = shift([*keep, fresh], len(keep), boot_cv)
    return test if test.sigmas < -sigmas else None


def drift_confirmed(level: Sequence[float], flag: Shift, boot_cv: float) -> Shift | None:
    """The re-base, if the confirmation boot (``level[-1]``, after the flagged boots) confirms
    the flag: the boots from ``flag.start`` on are ``CONFIRM_SIGMAS`` standard errors off the
    level before them, in the flag's direction, the confirmation boot on that side too, and
    most of them on that side (``_most_agree``). ``None``: not confirmed, the flagged boots
    stay in the champion's level."""
    if min(level) <= 0:
        return None
    test = shift(level, flag.start, boot_cv)
    direction = math.copysign(1.0, flag.sigmas)
    agrees = math.log(level[-1] / test.before) * direction > 0
    shifted = test.sigmas * direction > CONFIRM_SIGMAS and _most_agree(level, test)
    return test if agrees and shifted else None


def _most_agree(level: Sequence[float], test: Shift) -> bool:
    """Whether more than half of the boots from ``test.start`` on lie on the side of the level
    before them that the shift points to. A drift moves every boot after it; a champion that
    measures 2400 or 4900 at random (the GPU round's 16 slots at concurrency 8) puts its boots
    on both sides, and two low ones among four are no new level."""
    direction = math.copysign(1.0, test.sigmas)
    post = level[test.start :]
    side = sum(1 for v in post if math.log(v / test.before) * direction > 0)
    return 2 * side > len(post)
