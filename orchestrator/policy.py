"""The boot policy: what is booted next for an experiment, and when it is decided.

``verdict.assess`` says what the evidence so far supports (keep, discard, inconclusive,
invalid, or undecided: another boot, or a confirmation). This module turns that into the
round's next step, as a typed action the round only carries out:

- ``BootCandidate``: boot the experiment's config (its first measurement, the rest of an
  interrupted one, another boot while undecided, a confirmation boot, or once more after a
  boot with a node's clocks off — the slow-clock reboot, never a verdict);
- ``BootChampion``: re-measure the champion (the confirmation rule wants it measured after the
  candidate's last boot; an undecided verdict wants its fewer boots balanced), capped at
  ``CHAMPION_BOOTS_PER_BOOT`` × ``max_boots`` per verdict;
- ``Decide``: the final verdict, with the measurements it rests on;
- ``Crash``: the config failed for its own reasons, and the failure counts (it reproduced, or
  its class is one the change's knob declares monotone): a ``crash`` verdict, the value barred.
  A first configuration failure that is not monotone is booted once more instead
  (``config_failure``): a flaky start does not bar a value for good. One that reproduced waits
  for the champion to boot first (``BootChampion`` with ``checks``): if the champion fails too,
  the cluster broke, not the change (``champion_failure``: the champion is booted once more,
  then the round stops, the change undecided and nothing barred; the change's failures before
  the champion's count no more, ``counted_failures``).

The champion's own schedule is here too: when a re-measurement is due (``remeasure_due``: too
few trusted boots, the drift sentinel's count or age), whether a re-measurement flags a drift
(``suspected_drift``) and whether one more boot confirms it (``drift_confirmed``: only a
confirmed drift re-bases the champion's level), and how often a re-measurement with clocks off
is taken again. Every function is pure: the round reads the ledger, asks, and does what it is
told.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

from knobs.vocabulary import GUARDRAIL_RULES, BootRole, Status, Undecided
from orchestrator.measurements import Measurement
from orchestrator.posterior import Posterior
from orchestrator.profile import VerdictSpec
from orchestrator.verdict import BALANCE_LOOKS, Assessment, objective_of, worse

#: The champion may be booted at most this many times ``max_boots`` for one verdict.
CHAMPION_BOOTS_PER_BOOT = 2
#: A change whose boots over its looks under one champion reach this many times the most the
#: champion is balanced to (``verdict.BALANCE_LOOKS`` × ``max_boots``), still undecided, has
#: had its fair trial: past twice the champion's boots, all the candidate boots there could
#: ever be take off less than a fifth of the comparison's error (the champion's share stays),
#: so further looks would each stop the same way.
FAIR_TRIAL = 2
#: A champion re-measurement with a node's clocks off is taken this many times in all.
CHAMPION_CLOCK_TRIES = 2
#: The cluster's measurements in a row (whatever config they measured) with one node's clocks
#: off in each that stop the round: the power cycles before each boot did not bring the node
#: back (DOMAIN: only a power cycle fixes stuck clocks), and every boot after would measure the
#: node, not a config. A node whose clocks stick at 2 % of its boots by chance (the twin's
#: landscapes) does it four times in a row once in 6 million boots (a cluster of four such
#: nodes: once in 1.5 million); a boot of that cluster has some node off about once in 13, so
#: three in a row of any node would stop about three rounds of sixty boots in a hundred.
CLOCKS_OFF_IN_A_ROW = 4
#: The cluster's measurements in a row with some node's clocks off, whichever, that stop the
#: round (nodes taking turns: no measurement left to judge a config on).
CLOCKS_OFF_ANY_IN_A_ROW = 8
#: A re-measurement this many standard errors off the champion's level is a suspected drift
#: (about 5 % of re-measurements on a cluster that did not drift): the champion is booted once
#: more to confirm it, never re-based on the one boot.
DRIFT_SIGMAS = 2.0
#: A suspected drift is confirmed, and the champion's level re-based, when the boots from the
#: suspicion on, the confirmation boot included, are this many standard errors off the level
#: before them (about 0.3 % two-sided), in the flag's direction.
CONFIRM_SIGMAS = 3.0

CHAMPION_CHECK = (
    "the champion first: a failure that reproduced bars its value only if the cluster still "
    "boots the champion"
)
SLOW_CLOCK_NOTE = (
    "  a node's clocks were off during this boot: it is set aside and the config booted once more"
)
#: A configuration failure bars its value once it happened this many times for one experiment
#: (a class the change's knob declares monotone bars at the first).
REPRODUCED = 2


@dataclass(frozen=True)
class BootCandidate:
    """Boot the experiment's config. ``measurement``: continue that interrupted measurement
    (``None``: a new one). ``note``/``phase``: what to tell the person first."""

    role: BootRole
    measurement: int | None = None
    note: str | None = None
    phase: str | None = None


@dataclass(frozen=True)
class BootChampion:
    """Re-measure the champion before the verdict goes on; ``measurements``: what the verdict
    rests on so far (what it is decided on if the champion's boot fails); ``checks``: the
    crash it stands between (``None``: a re-measurement for the comparison)."""

    phase: str
    measurements: Sequence[Measurement]
    checks: Assessment | None = None


@dataclass(frozen=True)
class Decide:
    """The final verdict and the measurements it rests on (a set-aside slow boot excluded)."""

    assessment: Assessment
    measurements: Sequence[Measurement]
    phase: str | None = None


@dataclass(frozen=True)
class Crash:
    """A ``crash`` verdict: the config's boot failed for its own reasons, and that counts."""

    assessment: Assessment
    phase: str | None = None


Action = BootCandidate | BootChampion | Decide | Crash


@dataclass(frozen=True)
class BootFailure:
    """A boot of the experiment that failed for the config's reasons (not ``INFRASTRUCTURE``)."""

    failure_class: str
    message: str


@dataclass(frozen=True)
class Progress:
    """Where one experiment's verdict stands, as the ledger has it."""

    baseline: bool
    measurements: Sequence[Measurement]
    min_matmul_rate: float
    #: the champion's boots since this experiment's first boot
    champion_boots_during: int = 0
    #: whether the champion's last boot came after this experiment's last boot
    champion_measured_after: bool = False
    #: the experiment's boots that failed for the config's reasons, oldest first
    failed_boots: Sequence[BootFailure] = ()
    #: whether its last boot is one of them (the failure not answered yet)
    last_failed: bool = False
    #: the failure classes that bar this change at once (its knob declares them monotone)
    monotone: Collection[str] = frozenset()


def next_action(
    spec: VerdictSpec,
    progress: Progress,
    judge: Callable[[Sequence[Measurement]], Assessment],
) -> Action:
    """The next step for an experiment. ``judge``: the verdict on given measurements
    (``verdict.assess`` against the champion's evidence), asked only when one is due."""
    ms = list(progress.measurements)
    if progress.last_failed:
        crashed = config_failure(progress.failed_boots, progress.monotone)
        if crashed is not None and _champion_unchecked(progress):
            # a failure that reproduced bars a value only if the cluster still boots what
            # booted before: a node gone bad (a full disk, a wedged GPU) fails every config
            measured = [m for m in ms if m.complete]
            return BootChampion(phase=CHAMPION_CHECK, measurements=measured, checks=crashed)
        if crashed is not None:
            return Crash(crashed)
    unfinished = next((m for m in ms if not m.complete), None)
    if unfinished is not None:
        # an interrupted measurement, or one whose boot failed for the config's reasons once:
        # the same config is booted again (a flaky start is measured, a bad flag fails again)
        note = _retry_note(progress.failed_boots[-1]) if progress.last_failed else None
        return BootCandidate(BootRole(unfinished.role), unfinished.index, note=note)
    if not ms:
        return BootCandidate(BootRole.MEASURE)
    if progress.baseline:
        baseline = Assessment(
            Status.KEEP, "baseline", "first measurement of the champion", {"delta_pct": 0.0}
        )
        return Decide(_noted(baseline, progress.failed_boots), ms)
    # a boot with a node's clocks off measured the node, not the config: it is set aside and
    # the boot taken once more, as often as it comes (a node whose clocks stay off stops the
    # round: ``CLOCKS_OFF_IN_A_ROW``); without the reboot, the verdict rules it invalid
    if spec.reboot_slow_clocks:
        if not ms[-1].trusted(progress.min_matmul_rate):
            return BootCandidate(BootRole(ms[-1].role), note=SLOW_CLOCK_NOTE)
        ms = [m for m in ms if m.trusted(progress.min_matmul_rate)]
    assessment = judge(ms)
    if assessment.final:
        return Decide(_noted(assessment, progress.failed_boots), ms)
    return _undecided(spec, progress, assessment, ms)


def _undecided(
    spec: VerdictSpec, progress: Progress, assessment: Assessment, ms: Sequence[Measurement]
) -> Action:
    """Another boot for an undecided verdict: the champion's or the candidate's."""
    reason = assessment.reason
    champion_cap = CHAMPION_BOOTS_PER_BOOT * spec.max_boots
    # a confirmation is judged against the champion re-measured after the candidate's last
    # boot; while undecided, the verdict may ask for the champion's next boot
    confirming = assessment.status == Undecided.CONFIRM
    if (confirming and not progress.champion_measured_after) or (
        assessment.next_boot == "champion" and progress.champion_boots_during < champion_cap
    ):
        return BootChampion(phase=reason, measurements=ms)
    if assessment.status == Undecided.MORE and assessment.next_boot == "champion":
        # its boots keep not counting (a node's clocks off, drift after drift): decide on what
        # there is rather than boot it for ever
        capped = Assessment(
            Status.INCONCLUSIVE,
            "champion-remeasure",
            f"{reason}: the champion was booted {progress.champion_boots_during} times for "
            "this verdict, the most it may be",
            dict(assessment.stats),
        )
        return Decide(_noted(capped, progress.failed_boots), ms, phase=reason)
    role = BootRole.CONFIRM if confirming else BootRole.REPEAT
    return BootCandidate(role, phase=reason)


def config_failure(failed: Sequence[BootFailure], monotone: Collection[str]) -> Assessment | None:
    """After a boot failed for the config's reasons (the last of ``failed``: the experiment's
    configuration failures, oldest first): the ``crash`` verdict, or ``None`` to boot the same
    config once more. A class in ``monotone`` (one the change's knob declares so: an OOM above
    a memory fraction) is a crash at once, as is any failure that reproduced (``REPRODUCED``
    in all): a bad flag fails every time, a flaky start once."""
    last = failed[-1]
    if last.failure_class in monotone:
        return crash(last.failure_class, last.message)
    if len(failed) < REPRODUCED:
        return None
    times = "twice" if len(failed) == 2 else f"{len(failed)} times"
    classes = ", ".join(f.failure_class for f in failed)
    verdict = crash(last.failure_class, f"failed {times}: {classes}; {last.message}")
    return Assessment(
        verdict.status, verdict.rule, verdict.reason, {**verdict.stats, "failed_boots": len(failed)}
    )


def _champion_unchecked(progress: Progress) -> bool:
    """Whether a configuration failure that reproduced must wait for the champion to boot
    first: a candidate's (not the baseline's, which has no champion), of a class its knob does
    not declare monotone (that one is the knob's at once), with no champion boot come up since
    the candidate's last boot."""
    last = progress.failed_boots[-1].failure_class
    return (
        not progress.baseline
        and last not in progress.monotone
        and not progress.champion_measured_after
    )


def champion_failure(in_a_row: int) -> bool:
    """Whether the round stops after the champion, which booted before, failed ``in_a_row``
    boots for what would be a configuration's reasons: its config did not change, so the
    cluster did (a full disk, a wedged GPU, a driver that lost its device). Once is booted
    again (a flaky start); when it reproduced, no change's boot would mean anything until the
    cluster is mended."""
    return in_a_row >= REPRODUCED


def counted_failures(
    failed: Sequence[int], champion_failed: Sequence[int], champion_up: Sequence[int]
) -> list[int]:
    """Which of a change's configuration failures (its failed boots' ids) count towards its
    crash: those after the last configuration failure of the champion's (``champion_failed``,
    boot ids) that a boot of the champion's that came up (``champion_up``) followed. A change
    that failed on a cluster that then failed its champion too failed on a broken cluster:
    once the champion boots again, those failures are the cluster's, and the change is booted
    afresh. Until then they count, and the champion is what is booted next."""
    mended = [f for f in champion_failed if any(up > f for up in champion_up)]
    since = max(mended, default=0)
    return [b for b in failed if b > since]


def _retry_note(failure: BootFailure) -> str:
    return (
        f"  {failure.failure_class}: {failure.message}; a configuration failure bars its value "
        "only when it reproduces: booting the same config once more"
    )


def _noted(assessment: Assessment, failed: Sequence[BootFailure]) -> Assessment:
    """``assessment``, saying which boots failed before and did not fail again (they are not
    measurements: the verdict rests on the boots that came up)."""
    if not failed:
        return assessment
    classes = ", ".join(f.failure_class for f in failed)
    return Assessment(
        assessment.status,
        assessment.rule,
        f"{assessment.reason}; {len(failed)} failed boot(s) before ({classes}), not reproduced",
        {**assessment.stats, "failed_boots": len(failed)},
        assessment.next_boot,
    )


def crash(failure_class: str, message: str) -> Assessment:
    """The verdict on a config whose boot or bench failed."""
    rule = "bench" if failure_class == "bench_failed" else "boot"
    return Assessment(Status.CRASH, rule, message, {"failure_class": failure_class})


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


#: Seconds the round waits for a ledger that does not answer before it resumes, wait after
#: wait (about half an hour in all; then it stops, exit 4, for the same command to resume);
#: the same schedule for an MLflow that does not answer as the round's command opens it.
LEDGER_WAITS = (10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 600.0)


#: The longest wait between two tries of a boot that failed for the infrastructure's reasons:
#: the doubling backoff stops here, so the default retries (``VerdictSpec.infra_retries``)
#: wait 30 s, 1, 2, 4, 8 and 10 min — a node's reboot, a switch's, a network's maintenance
#: window — before the round stops and the night with it.
INFRA_BACKOFF_MAX_S = 600.0


def clocks_off_stop(off: Sequence[Collection[int]]) -> tuple[list[int], int] | None:
    """Whether clocks off stop the round, and if so the nodes to name and how many
    measurements in a row: ``off``, the nodes off in each of the cluster's latest measurements
    that ran with clocks off, newest first (``measurements.clocks_off_in_a_row``). One node off
    in each of ``CLOCKS_OFF_IN_A_ROW`` stops it, as do ``CLOCKS_OFF_ANY_IN_A_ROW`` with any
    node off; fewer are chance, each boot set aside and taken again."""
    common = set(off[0]) if off else set()
    run = 0
    for nodes in off:
        if not common & set(nodes):
            break
        common &= set(nodes)
        run += 1
    if run >= CLOCKS_OFF_IN_A_ROW:
        return sorted(common), run
    if len(off) >= CLOCKS_OFF_ANY_IN_A_ROW:
        return sorted({r for nodes in off for r in nodes}), len(off)
    return None


def infrastructure_retry(spec: VerdictSpec, failures: int) -> float | None:
    """After a boot failed for the infrastructure's reasons (``INFRASTRUCTURE``): the seconds
    to wait before taking it again, or ``None`` when the retries are spent and the round stops
    (exit 5, the experiment left undecided for the same command to resume). ``failures``: the
    experiment's infrastructure failures in a row, this one included. Such a failure is never a
    verdict on the config."""
    if failures > spec.infra_retries:
        return None
    return min(INFRA_BACKOFF_MAX_S, spec.infra_backoff_s * 2.0 ** (failures - 1))


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
