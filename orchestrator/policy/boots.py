"""What is booted next for an experiment, and when it is decided.

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
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from knobs.vocabulary import BootRole, Status, Undecided
from orchestrator.measurements import Measurement
from orchestrator.profile_sections import VerdictSpec
from orchestrator.verdict import Assessment, slow_ranks

#: The champion may be booted at most this many times ``max_boots`` for one verdict.
CHAMPION_BOOTS_PER_BOOT = 2

CHAMPION_CHECK = (
    "the champion first: a failure that reproduced bars its value only if the cluster still "
    "boots the champion"
)
CHAMPION_UNMEASURED = (
    "the champion first: it has no measurement of the cells as the profile defines them now"
)
SLOW_CLOCK_NOTE = (
    "  {nodes}'s clocks were off during this boot: it is set aside and the config booted once more"
)


def slow_clock_note(ranks: Sequence[int]) -> str:
    """``SLOW_CLOCK_NOTE`` naming the nodes whose clocks were off (``node-3``, ``node-1 and
    node-3``), so that a night's log says which node to look at without the report."""
    names = [f"node-{r}" for r in ranks] or ["a node"]
    said = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
    return SLOW_CLOCK_NOTE.format(nodes=said)


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
    #: whether the champion has a level: a measurement of every cell as the profile defines it
    #: now (``measurements.counts``; none once a cell it was measured on changed)
    champion_level: bool = True


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
            slow = slow_ranks(ms[-1].cells, progress.min_matmul_rate)
            return BootCandidate(BootRole(ms[-1].role), note=slow_clock_note(slow))
        ms = [m for m in ms if m.trusted(progress.min_matmul_rate)]
    if not progress.champion_level:
        # its readings are of cells since redefined: nothing alike to judge against yet
        return BootChampion(phase=CHAMPION_UNMEASURED, measurements=ms)
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
