"""The boot policy as pure functions: what is booted next, when it is decided, when the
champion is re-measured and what counts as its drift. Every case names the exact action."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence

import pytest

from knobs.vocabulary import BootRole, Status, Undecided
from orchestrator import policy
from orchestrator.measurements import Measurement
from orchestrator.policy import BootCandidate, BootChampion, Decide, Progress
from orchestrator.profile_sections import VerdictSpec
from orchestrator.verdict import Assessment
from tests.test_verdict import cell

SPEC = VerdictSpec()


def measured(
    index: int, tok_s: float = 100.0, *, role: str = "measure", rate: float = 1.0
) -> Measurement:
    return Measurement(index, role, [cell(tok_s, rate=rate)], complete=True)


def never(_: Sequence[Measurement]) -> Assessment:
    raise AssertionError("the verdict was asked although nothing was due")


def judged_as(
    assessment: Assessment, seen: list[Sequence[Measurement]]
) -> Callable[[Sequence[Measurement]], Assessment]:
    """A verdict that says ``assessment`` and remembers what it was shown."""

    def judge(ms: Sequence[Measurement]) -> Assessment:
        seen.append(ms)
        return assessment

    return judge


def progress(
    *ms: Measurement, baseline: bool = False, during: int = 0, after: bool = False
) -> Progress:
    return Progress(
        baseline=baseline,
        measurements=ms,
        min_matmul_rate=0.9,
        champion_boots_during=during,
        champion_measured_after=after,
    )


def test_an_experiment_without_a_boot_boots_its_first_measurement() -> None:
    assert policy.next_action(SPEC, progress(), never) == BootCandidate(BootRole.MEASURE)


def test_an_interrupted_measurement_is_continued_in_its_own_role() -> None:
    partial = Measurement(1, "confirm", [], complete=False)
    action = policy.next_action(SPEC, progress(measured(0), partial), never)
    assert action == BootCandidate(BootRole.CONFIRM, measurement=1)


def test_the_baseline_is_kept_on_its_first_measurement() -> None:
    action = policy.next_action(SPEC, progress(measured(0), baseline=True), never)
    assert isinstance(action, Decide)
    assert action.assessment.status == Status.KEEP and action.assessment.rule == "baseline"


def test_a_last_boot_with_clocks_off_is_taken_again_without_a_verdict() -> None:
    action = policy.next_action(SPEC, progress(measured(0), measured(1, rate=0.5)), never)
    # the night's log names the node to look at (rank 0's clocks were off in that boot)
    assert action == BootCandidate(
        BootRole.MEASURE,
        note="  node-0's clocks were off during this boot: it is set aside and the config "
        "booted once more",
    )
    assert policy.slow_clock_note([1, 3]).startswith("  node-1 and node-3's clocks were off")


def test_an_earlier_slow_boot_is_set_aside_and_the_verdict_rests_on_the_rest() -> None:
    slow, good = measured(0, rate=0.5), measured(1)
    seen: list[Sequence[Measurement]] = []
    keep = Assessment(Status.KEEP, "posterior", "confirmed gain")
    action = policy.next_action(SPEC, progress(slow, good), judged_as(keep, seen))
    assert seen == [[good]]
    assert action == Decide(keep, [good])


def test_with_slow_clock_reboots_off_the_verdict_sees_every_boot() -> None:
    spec = VerdictSpec(reboot_slow_clocks=False)
    seen: list[Sequence[Measurement]] = []
    invalid = Assessment(Status.INVALID, "clocks", "clocks were off")
    slow = measured(0, rate=0.5)
    assert policy.next_action(spec, progress(slow), judged_as(invalid, seen)) == Decide(
        invalid, [slow]
    )
    assert seen == [[slow]]


def test_a_confirmation_first_wants_the_champion_measured_after_the_candidate() -> None:
    confirm = Assessment(Undecided.CONFIRM, "posterior", "promising, confirming")
    before = policy.next_action(SPEC, progress(measured(0), after=False), judged_as(confirm, []))
    assert before == BootChampion(phase="promising, confirming", measurements=[measured(0)])
    after = policy.next_action(SPEC, progress(measured(0), after=True), judged_as(confirm, []))
    assert after == BootCandidate(BootRole.CONFIRM, phase="promising, confirming")


def test_an_undecided_verdict_boots_whose_side_it_asks_for() -> None:
    champion = Assessment(Undecided.MORE, "posterior", "undecided", next_boot="champion")
    candidate = Assessment(Undecided.MORE, "posterior", "undecided", next_boot="candidate")
    ms = progress(measured(0), measured(1))
    assert isinstance(policy.next_action(SPEC, ms, judged_as(champion, [])), BootChampion)
    assert policy.next_action(SPEC, ms, judged_as(candidate, [])) == BootCandidate(
        BootRole.REPEAT, phase="undecided"
    )


def test_the_champion_is_booted_at_most_twice_max_boots_for_one_verdict() -> None:
    more = Assessment(Undecided.MORE, "posterior", "undecided", {"g": 0.01}, next_boot="champion")
    cap = policy.CHAMPION_BOOTS_PER_BOOT * SPEC.max_boots
    below = progress(measured(0), during=cap - 1)
    assert isinstance(policy.next_action(SPEC, below, judged_as(more, [])), BootChampion)
    at = policy.next_action(SPEC, progress(measured(0), during=cap), judged_as(more, []))
    assert isinstance(at, Decide)
    assert at.assessment.status == Status.INCONCLUSIVE
    assert at.assessment.rule == "champion-remeasure"
    assert f"booted {cap} times" in at.assessment.reason
    assert at.assessment.stats == {"g": 0.01} and at.phase == "undecided"


def test_a_failed_boot_is_a_crash_ruled_by_where_it_failed() -> None:
    assert policy.crash("oom", "out of memory") == Assessment(
        Status.CRASH, "boot", "out of memory", {"failure_class": "oom"}
    )
    assert policy.crash("bench_failed", "timeout").rule == "bench"


def test_a_failing_champion_stops_the_round_and_once_mended_clears_the_change() -> None:
    """The champion, which booted before, failing once is booted again; failing twice in a row
    stops the round. A change's failures before a champion failure that a good champion boot
    then followed were the cluster's: they count no more; while the champion has not come up
    since its failure, they still count (the champion is what is booted next)."""
    assert not policy.champion_failure(1) and policy.champion_failure(2)
    assert policy.counted_failures([3, 4], [5], [1]) == [3, 4]  # not mended yet
    assert policy.counted_failures([3, 4], [5, 6], [1, 7]) == []  # mended after both
    assert policy.counted_failures([3, 4, 8], [5], [1, 6]) == [8]  # a failure since counts
    assert policy.counted_failures([3, 4], [], [1, 5]) == [3, 4]  # the champion never failed


@pytest.mark.parametrize(
    ("trusted", "since", "age", "due"),
    [
        (1, 0, 0.0, False),  # nothing decided since its last boot
        (1, 1, 0.0, True),  # too few boots: topped up after each decided experiment
        (3, 1, 0.0, False),  # enough boots, the sentinel not due
        (3, VerdictSpec().drift_every, 0.0, True),  # the drift sentinel's count
    ],
)
def test_when_the_champion_is_measured_again(
    trusted: int, since: int, age: float, due: bool
) -> None:
    assert policy.remeasure_due(SPEC, trusted_boots=trusted, decided_since=since, age_s=age) is due


def test_an_old_champion_measurement_is_due_by_age() -> None:
    spec = VerdictSpec(drift_max_age_s=600)
    assert policy.remeasure_due(spec, trusted_boots=3, decided_since=0, age_s=601)
    assert not policy.remeasure_due(spec, trusted_boots=3, decided_since=0, age_s=599)


def test_a_drift_is_significant_beyond_two_standard_errors() -> None:
    cv = 0.05
    se = cv * math.sqrt(1 + 1 / 3)
    level, small = policy.drift([100.0, 100.0, 100.0], 100.0 * math.exp(1.9 * se), cv)
    assert level == pytest.approx(100.0) and not small
    _, large = policy.drift([100.0, 100.0, 100.0], 100.0 * math.exp(2.1 * se), cv)
    assert large
    # a first measurement is its own level: no drift
    assert policy.drift([], 90.0, cv) == (90.0, False)


def test_a_flagged_drift_is_confirmed_only_by_a_boot_that_agrees() -> None:
    """A boot 2 standard errors off flags a drift; the level is re-based only when the
    confirmation boot agrees: the flagged and confirming boots pooled 3 standard errors off,
    on the same side."""
    cv = 0.03
    flag = policy.suspected_drift([100.0, 100.0, 100.0, 90.0], cv, None)
    assert flag is not None and flag.start == 3 and flag.sigmas < -policy.DRIFT_SIGMAS
    assert policy.suspected_drift([100.0, 100.0, 100.0, 95.0], cv, None) is None
    # the cluster is as it was: one unlucky boot, not a drift
    assert policy.drift_confirmed([100.0, 100.0, 100.0, 90.0, 100.0], flag, cv) is None
    # the confirmation boot on the other side of the level confirms nothing
    assert policy.drift_confirmed([100.0, 100.0, 100.0, 90.0, 112.0], flag, cv) is None
    rebase = policy.drift_confirmed([100.0, 100.0, 100.0, 90.0, 91.0], flag, cv)
    assert rebase is not None and rebase.start == 3
    assert rebase.before == pytest.approx(100.0)
    assert rebase.after == pytest.approx(math.sqrt(90.0 * 91.0))
    assert rebase.sigmas < -policy.CONFIRM_SIGMAS


def test_an_unconfirmed_flag_is_screened_again_with_the_boots_since() -> None:
    """A drift the confirmation missed: the boots since the last unconfirmed flag are tested
    together against the level before it, so the flag's boots do not dilute the drift into
    the level. Alone, the latest boot flags nothing."""
    cv = 0.03
    level = [100.0, 100.0, 100.0, 90.0, 100.0, 92.0]  # a flag at position 3, not confirmed
    assert policy.suspected_drift(level, cv, None) is None
    flag = policy.suspected_drift(level, cv, 3)
    assert flag is not None and flag.start == 3
    assert policy.drift_confirmed([*level, 91.0], flag, cv) is not None
    # a flag at the level's first boot has nothing before it to compare with
    assert policy.suspected_drift([90.0, 91.0], cv, 0) is None


@pytest.mark.parametrize("n", [1, 3, 8])
def test_the_sentinel_s_false_alarms_per_re_measure_are_under_one_percent(n: int) -> None:
    """No drift: a champion measured on ``n`` boots, re-measured, and confirmed when flagged;
    re-bases in under 1 % of re-measurements (the flag alone: about 5 %)."""
    rng = random.Random(n)
    cv, trials = 0.05, 20000
    flags = rebases = 0
    for _ in range(trials):
        level = [100.0 * math.exp(rng.gauss(0, cv)) for _ in range(n + 1)]
        flag = policy.suspected_drift(level, cv, None)
        if flag is None:
            continue
        flags += 1
        confirm = [*level, 100.0 * math.exp(rng.gauss(0, cv))]
        rebases += policy.drift_confirmed(confirm, flag, cv) is not None
    assert 0.03 < flags / trials < 0.07
    assert rebases / trials < 0.01


def test_a_champion_that_measures_high_or_low_at_random_has_not_drifted() -> None:
    """The third GPU round: speculation off at 16 slots measured 2400 or 4900 tok/s at random
    (the concurrency-8 cells collapse on some boots). Two low boots four apart flagged and
    "confirmed" a -44 % drift between two high ones; now a new level needs most of its boots
    on its side."""
    cv = 0.06
    level = [4042.0, 4402.0, 4458.0, 4650.0, 2429.0]  # boot 15 came out low
    flag = policy.suspected_drift(level, cv, None)
    assert flag is not None and flag.start == 4
    assert policy.drift_confirmed([*level, 4611.0], flag, cv) is None  # boot 16: high again
    level = [*level, 4611.0, 4948.0]
    # the boots since the unconfirmed flag (one low, two high) flag no fall; the latest boot
    # alone, against a level the low boot pulled down, flags a rise
    rise = policy.suspected_drift(level, cv, 4)
    assert rise is not None and rise.start == 6 and rise.sigmas > 0
    # boot 21 came out low: it confirms neither the rise nor the fall (two of four low)
    assert policy.drift_confirmed([*level, 2514.0], rise, cv) is None
    assert policy.drift_confirmed([*level, 2514.0], flag, cv) is None
    # a drift that moves every boot is still one: three low boots of four
    assert policy.drift_confirmed([*level[:5], 2600.0, 4700.0, 2500.0], flag, cv) is not None


def test_a_keeps_boots_are_set_aside_only_when_its_own_boot_reads_low_enough() -> None:
    """One-sided, at ``keep_boots_sigmas`` standard errors of the keep's boots against one
    boot: two boots at 130 and one of its own at 120 (-7.7 %, se 6.1 % at a 5 % boot CV: 1.3
    standard errors) set them aside at 1.0 but not at 1.5; a boot of its own that reads higher
    never does (the boots that keep a change were chosen for reading high, not low); null
    turns the test off."""
    keep = [130.0, 130.0]
    at = {s: VerdictSpec(keep_boots_sigmas=s) for s in (1.0, 1.5, None)}
    low = policy.keep_boots_inflated(at[1.0], keep, 120.0, 0.05)
    assert low is not None and low.start == 2 and -1.4 < low.sigmas < -1.2
    assert policy.keep_boots_inflated(at[1.5], keep, 120.0, 0.05) is None
    assert policy.keep_boots_inflated(at[1.0], keep, 150.0, 0.05) is None
    assert policy.keep_boots_inflated(at[None], keep, 100.0, 0.05) is None
    assert policy.keep_boots_inflated(at[1.5], keep, 110.0, 0.05) is not None


def test_a_kept_champion_is_booted_at_once_for_its_own_boot_and_to_finish_afresh() -> None:
    """A kept change with no boot of its own is re-measured before the next proposal, however
    many boots kept it; one whose keep's boots were set aside, until it has ``champion_boots``
    of its own (a kill between those boots resumes them first). The baseline keeps the old
    schedule, but for its first boots: at once while it has too few (the boots it would take
    after the first verdicts, taken before them)."""
    spec = VerdictSpec(champion_boots=3)
    due = policy.remeasure_due
    assert due(spec, trusted_boots=3, decided_since=0, age_s=0.0, own_boots=0)
    assert not due(spec, trusted_boots=4, decided_since=0, age_s=0.0, own_boots=1)
    assert due(spec, trusted_boots=2, decided_since=0, age_s=0.0, own_boots=2, afresh=True)
    assert not due(spec, trusted_boots=3, decided_since=0, age_s=0.0, own_boots=3, afresh=True)
    assert not due(spec, trusted_boots=1, decided_since=0, age_s=0.0)
    assert due(spec, trusted_boots=1, decided_since=1, age_s=0.0)
    assert due(spec, trusted_boots=2, decided_since=0, age_s=0.0, baseline=True)
    assert not due(spec, trusted_boots=3, decided_since=0, age_s=0.0, baseline=True)
    off = VerdictSpec(champion_boots=3, keep_boots_sigmas=None)
    assert not due(off, trusted_boots=3, decided_since=0, age_s=0.0, own_boots=0)


def test_the_threshold_policy_never_tests_a_keeps_boots() -> None:
    """The common practice (one run against the champion's last, the benchmark's greedy
    baseline) is reproduced as it was: no boot of its own after a keep, nothing set aside."""
    spec = VerdictSpec(policy="threshold", champion_boots=1)
    assert not policy.tests_keep_boots(spec)
    assert not policy.remeasure_due(spec, trusted_boots=1, decided_since=0, age_s=0.0, own_boots=0)
    assert policy.keep_boots_inflated(spec, [130.0, 130.0], 100.0, 0.05) is None


def test_clocks_off_stop_the_round_when_chance_at_the_clusters_rate_explains_them_no_more() -> None:
    """Before the ledger has measured the cluster, a node's clocks are taken to stick at 2 % of
    its boots: one node off in each of four measurements in a row (1.6 in 10 million) stops the
    round, naming it; three are chance (each boot set aside and taken again). Nodes taking
    turns on a four-node cluster (some node off in about one boot of 13) stop it at six.
    The cluster's own measurements override the 2 %: where its node 1 was off in 60 of 200
    measurements (a rate of 0.24), four or nine in a row are its habit, not a stuck node,
    and it takes ten; where a thousand measurements had no clock off, four still stop it
    (never fewer)."""
    nodes = (0, 1, 2, 3)
    fresh = policy.ClocksHistory(measurements=0, off={}, nodes=nodes)
    assert policy.clocks_off_rate(fresh, 1) == pytest.approx(0.02)
    assert policy.clocks_off_stop([], fresh) is None
    assert policy.clocks_off_stop([[1]] * 3, fresh) is None
    assert policy.clocks_off_stop([[1], [1, 2], [1], [1]], fresh) == ([1], 4)
    assert policy.clocks_off_stop([[2], [1, 2], [1], [1], [1]], fresh) is None
    turns = [[1], [2], [3], [1], [2]]
    assert policy.clocks_off_stop(turns, fresh) is None
    assert policy.clocks_off_stop([*turns, [0]], fresh) == ([0, 1, 2, 3], 6)

    flaky = policy.ClocksHistory(measurements=200, off={1: 60}, nodes=nodes)
    assert policy.clocks_off_rate(flaky, 1) == pytest.approx(61 / 250)
    assert policy.clocks_off_stop([[1]] * 4, flaky) is None
    assert policy.clocks_off_stop([[1]] * 9, flaky) is None
    assert policy.clocks_off_stop([[1]] * 10, flaky) == ([1], 10)

    steady = policy.ClocksHistory(measurements=1000, off={}, nodes=nodes)
    assert policy.clocks_off_stop([[1]] * 3, steady) is None
    assert policy.clocks_off_stop([[1]] * 4, steady) == ([1], 4)


def test_a_node_is_flaky_when_its_clocks_are_off_more_often_than_the_others_explain() -> None:
    """``flaky_nodes``: node 1 off in 60 of 200 measurements, the others in 2 of 600 between
    them, is named (its chance at their rate is astronomically small); so is one off in 5 of
    11 on a fresh cluster. Off at the others' rate, or in fewer than three measurements, is
    not; a cluster where every node is off a third of the time names none (its habit, not a
    node's); a cluster of one node is weighed against the 2 % prior. Thousands of
    measurements sum without overflow."""
    nodes = (0, 1, 2, 3)
    sick = policy.flaky_nodes(policy.ClocksHistory(200, {1: 60, 2: 2}, nodes))
    assert list(sick) == [1] and sick[1] < 1e-30
    assert list(policy.flaky_nodes(policy.ClocksHistory(11, {1: 5}, nodes))) == [1]
    assert not policy.flaky_nodes(policy.ClocksHistory(200, {1: 4, 2: 3, 3: 5}, nodes))
    assert not policy.flaky_nodes(policy.ClocksHistory(2, {1: 2}, nodes))
    assert not policy.flaky_nodes(policy.ClocksHistory(300, {r: 100 for r in nodes}, nodes))
    assert list(policy.flaky_nodes(policy.ClocksHistory(20, {0: 6}, (0,)))) == [0]
    assert not policy.flaky_nodes(policy.ClocksHistory(200, {0: 5}, (0,)))
    big = policy.flaky_nodes(policy.ClocksHistory(5000, {1: 900, 2: 40}, nodes))
    assert list(big) == [1] and 0.0 <= big[1] < policy.FLAKY_CHANCE
