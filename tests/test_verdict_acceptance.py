"""The acceptance counters in the verdict: a change's null is "it does what its counters say"
(``orchestrator.acceptance``), on constructed measurements; each case asserts the exact status."""

from __future__ import annotations

import math

import pytest

from knobs.records import CellResultRecord
from knobs.spec import EffectPrior
from orchestrator.acceptance import ACCEPTANCE_CV_FLOOR, acceptance_shift
from orchestrator.noise import NoiseModel
from orchestrator.policy import look_promise
from orchestrator.profile_sections import VerdictSpec
from orchestrator.verdict import Evidence, assess
from tests.test_verdict import cell as verdict_cell

SPEC = VerdictSpec()
NOISE = NoiseModel(boot_cv=0.05, run_cv=0.02, boot_dof=0, run_dof=0)
#: the catalog's prior of the drafter adapter's rank: most of its changes do nothing
RARELY = EffectPrior(p_null=0.7, effect_pct=15.0)


def cell(name: str, tok_s: float, accepted: float | None) -> CellResultRecord:
    return verdict_cell(tok_s, name=name, accepted=accepted)


def test_the_counters_weigh_each_cell_by_its_share_of_the_champion() -> None:
    """Code carries three quarters of the champion's tokens and accepts 10 % more per step;
    prose accepts as before: the counters say +7.1 % (0.75·log 1.1), to the floor's error
    when the boots agree, to their own scatter when they do not."""
    champion = [[cell("code", 300.0, 3.0), cell("prose", 100.0, 2.0)]] * 2
    candidate = [[cell("code", 320.0, 3.3), cell("prose", 100.0, 2.0)]]
    shift = acceptance_shift(candidate, champion)
    assert shift is not None
    assert shift[0] == pytest.approx(0.75 * math.log(1.1))
    assert shift[1] == pytest.approx(ACCEPTANCE_CV_FLOOR * math.sqrt(1 + 1 / 2))
    scattered = [[cell("code", 300.0, 3.0 * 1.03), cell("prose", 100.0, 2.0)], *champion[:1]]
    wide = acceptance_shift(candidate, scattered)
    assert wide is not None and wide[1] > 3 * shift[1]


def test_no_counters_no_shift() -> None:
    """A cell without acceptance (speculation off, an engine without the counters) on either
    side: the counters say nothing, and the verdict's null is "no effect" as before."""
    champion = [[cell("code", 300.0, 3.0), cell("prose", 100.0, 2.0)]]
    off = [[cell("code", 300.0, None), cell("prose", 100.0, None)]]
    assert acceptance_shift(off, champion) is None
    assert acceptance_shift(champion, off) is None
    assert acceptance_shift([[cell("code", 300.0, 3.0)]], champion) is None  # a cell missing


def evidence(
    candidate: list[float], champion: list[float], counters: tuple[float, float] | None
) -> Evidence:
    return Evidence(
        candidate=candidate,
        champion=champion,
        confirmations=max(0, len(candidate) - 2),
        candidate_cells=[cell("code", candidate[-1], 3.0)],
        champion_cells=[cell("code", champion[-1], 3.0)],
        acceptance=counters,
    )


CHAMPION = [100.0, 104.0, 96.0]


def test_a_change_its_counters_explain_is_kept_on_readings_that_do_not_rule_out_a_null() -> None:
    """+3 % over three boots at 5 % boot noise, for a knob whose changes mostly do nothing:
    judged on its throughput alone it is out of reach; with counters that say +5 % ± 0.4 %
    the reading is what "it does what its counters say" predicts, and it is kept."""
    reading = [103.0, 108.0, 98.0]
    alone = assess(SPEC, evidence(reading, CHAMPION, None), NOISE, RARELY)
    assert alone.status != "keep" and alone.stats["p_gain"] < 0.5  # type: ignore[operator]
    counted = assess(SPEC, evidence(reading, CHAMPION, (math.log(1.05), 0.004)), NOISE, RARELY)
    assert counted.status == "keep", counted.reason
    assert counted.stats["acceptance_shift"] == pytest.approx(math.log(1.05))


def test_counters_that_promise_a_gain_the_throughput_denies_are_not_believed() -> None:
    """The counters say +5 % but the throughput reads −8 % over three boots (a bigger drafter
    adapter accepts more and drafts slower): the null is ruled out and the change is not
    kept; one boot of it at −8 % asks for another rather than keeping it."""
    reading = [92.0, 94.0, 90.0]
    slower = assess(SPEC, evidence(reading, CHAMPION, (math.log(1.05), 0.004)), NOISE, RARELY)
    assert slower.status == "discard", slower.reason
    assert slower.stats["post_p_effect"] > 0.5  # type: ignore[operator]
    first = assess(SPEC, evidence([92.0], CHAMPION, (math.log(1.05), 0.004)), NOISE, RARELY)
    assert first.status in ("more", "discard") and first.stats["p_gain"] < 0.9  # type: ignore[operator]


def test_counters_that_say_nothing_keep_nothing() -> None:
    """A change that does nothing, on a flat stack: its counters read +0.2 % by chance (a
    fraction of their error) and its throughput as the champion's; it is not kept, however
    sure the posterior is that it does nothing beyond its counters."""
    for reading in ([100.0], [100.0, 101.0, 99.0], [102.0, 101.0, 103.0]):
        noise = (math.log(1.002), ACCEPTANCE_CV_FLOOR * math.sqrt(1 / len(reading) + 1 / 3))
        result = assess(SPEC, evidence(reading, CHAMPION, noise), NOISE, RARELY)
        assert result.status != "keep", (reading, result.reason)


def test_counters_that_say_a_loss_discard_it_at_once() -> None:
    """The counters say −3 % (a KV dtype that rounds the drafter's logits) and one boot reads
    as the champion: a knob that mostly does nothing beyond its counters is discarded on that
    one boot."""
    result = assess(SPEC, evidence([100.0], CHAMPION, (math.log(0.97), 0.005)), NOISE, RARELY)
    assert result.status == "discard", result.reason


def test_what_a_change_judged_on_its_counters_still_promises_counts_its_null() -> None:
    """A change stopped for want of boots promises another look by ``E[max(0, δ)]`` under its
    posterior: where its null was the counters' +4 %, the null's share promises +4 % too, so a
    posterior that promises under the 2 % bar with a null at 0 clears it (and a verdict of an
    older release, without the counters in its stats, is read as before)."""
    stats: dict[str, object] = {"post_p_effect": 0.5, "post_mean": -0.02, "post_sd": 0.03}
    assert look_promise(SPEC, "futility", stats) is None
    counted = dict(stats, post_spike=math.log(1.04), post_spike_sd=0.004)
    promise = look_promise(SPEC, "futility", counted)
    assert promise is not None and promise > 0.5 * math.log(1.04)
