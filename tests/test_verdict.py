"""The verdict rule on constructed measurements: each case asserts the exact status."""

from __future__ import annotations

import math

import pytest

from knobs.records import CellResultRecord, NodeClockRecord
from orchestrator.noise import NoiseModel, learn, pooled
from orchestrator.profile import VerdictSpec
from orchestrator.verdict import Evidence, assess, objective, posterior

SPEC = VerdictSpec()
NOISE = NoiseModel(boot_cv=0.03, run_cv=0.02, boot_dof=0, run_dof=0)


def cell(
    tok_s: float,
    *,
    name: str = "code-c1",
    text: str = "a",
    rate: float = 1.0,
    ttft: float = 100.0,
    errors: int = 0,
) -> CellResultRecord:
    return CellResultRecord(
        cell=name,
        category="code",
        concurrency=1,
        context_tokens=0,
        duration=2.0,
        completed=10,
        errors=errors,
        total_output_tokens=int(tok_s * 2),
        output_throughput=tok_s,
        per_request_throughput=tok_s,
        mean_ttft_ms=ttft,
        median_ttft_ms=ttft,
        p90_ttft_ms=ttft,
        p99_ttft_ms=ttft,
        median_itl_ms=5.0,
        effective_concurrency=1.0,
        accepted_per_step=3.0,
        clocks=(NodeClockRecord(rank=0, sm_clock_mhz=2000 * rate, matmul_rate=rate),),
        fingerprints={"code-0": text},
    )


def evidence(
    candidate: list[float], champion: list[float], confirmations: int = 0, **kw: object
) -> Evidence:
    return Evidence(
        candidate=candidate,
        champion=champion,
        confirmations=confirmations,
        candidate_cells=[cell(candidate[-1], **kw)],  # type: ignore[arg-type]
        champion_cells=[cell(champion[-1])],
    )


def test_clear_win_is_confirmed_before_it_is_kept() -> None:
    first = assess(SPEC, evidence([115.0], [100.0, 101.0, 99.0]), NOISE)
    assert first.status == "confirm"
    kept = assess(
        SPEC, evidence([115.0, 114.0], [100.0, 101.0, 99.0, 100.5], confirmations=1), NOISE
    )
    assert kept.status == "keep"
    assert kept.stats["p_gain"] > SPEC.confidence  # type: ignore[operator]


def test_a_win_that_does_not_confirm_is_not_kept() -> None:
    failed = assess(
        SPEC, evidence([115.0, 99.0], [100.0, 101.0, 99.0, 100.0], confirmations=1), NOISE
    )
    assert failed.status != "keep"


def test_clear_loss_is_discarded_after_one_boot() -> None:
    result = assess(SPEC, evidence([85.0], [100.0, 100.0]), NOISE)
    assert result.status == "discard" and "worse" in result.reason


def test_within_noise_asks_for_more_then_ends_inconclusive() -> None:
    first = assess(SPEC, evidence([106.0], [100.0]), NOISE)
    assert first.status == "more"
    last = assess(SPEC, evidence([106.0, 105.0, 106.0], [100.0]), NOISE)
    assert last.status == "inconclusive"
    assert "3 boots" in last.reason


def test_equal_performance_is_discarded_as_not_worth_a_change() -> None:
    quiet = NoiseModel(boot_cv=0.005, run_cv=0.005, boot_dof=20, run_dof=0)
    result = assess(SPEC, evidence([100.1, 99.9], [100.0, 100.0, 100.0]), quiet)
    assert result.status == "discard" and "not worth a change" in result.reason


def test_output_mismatch_is_invalid_however_fast() -> None:
    result = assess(SPEC, evidence([200.0], [100.0], text="different"), NOISE)
    assert result.status == "invalid" and result.rule == "greedy-mismatch"
    assert result.stats["mismatched_prompts"] == ["code-0"]


def test_greedy_texts_are_compared_within_the_same_cell() -> None:
    # vLLM's CPU build in bf16 gives a prompt another greedy text at concurrency 4 than at 1
    # (other batch shapes), in every config alike: that is no difference between configs
    champion = [cell(100.0, name="code-c1", text="a"), cell(100.0, name="code-c4", text="b")]
    same = [cell(110.0, name="code-c1", text="a"), cell(110.0, name="code-c4", text="b")]
    ev = Evidence(
        candidate=[110.0], champion=[100.0], confirmations=0,
        candidate_cells=same, champion_cells=champion,
    )  # fmt: skip
    assert assess(SPEC, ev, NOISE).status != "invalid"
    other = [cell(110.0, name="code-c1", text="a"), cell(110.0, name="code-c4", text="c")]
    ev = Evidence(
        candidate=[110.0], champion=[100.0], confirmations=0,
        candidate_cells=other, champion_cells=champion,
    )  # fmt: skip
    result = assess(SPEC, ev, NOISE)
    assert result.status == "invalid" and result.stats["mismatched_prompts"] == ["code-0"]


def test_stuck_clocks_during_measurement_make_it_invalid() -> None:
    result = assess(SPEC, evidence([75.0], [100.0], rate=0.75), NOISE)
    assert result.status == "invalid" and result.rule == "clocks"


def test_guardrails_errors_and_ttft() -> None:
    assert assess(SPEC, evidence([130.0], [100.0], errors=1), NOISE).rule == "errors"
    slow = assess(SPEC, evidence([130.0], [100.0], ttft=400.0), NOISE)
    assert slow.status == "discard" and slow.rule == "ttft-guardrail"


def test_the_ttft_guardrail_ignores_growth_no_user_would_feel() -> None:
    """With a +30% / 50 ms guardrail, TTFT p90 100 -> 145 ms (+45%, but +45 ms) is no
    regression and 100 -> 160 ms (+60 ms) is; with no floor, 145 ms is one too."""
    spec = VerdictSpec(ttft_p90_regression_pct=30.0, ttft_p90_min_increase_ms=50.0)
    assert assess(spec, evidence([130.0], [100.0], ttft=145.0), NOISE).rule != "ttft-guardrail"
    slow = assess(spec, evidence([130.0], [100.0], ttft=160.0), NOISE)
    assert slow.status == "discard" and slow.rule == "ttft-guardrail"
    strict = VerdictSpec(ttft_p90_regression_pct=30.0, ttft_p90_min_increase_ms=0.0)
    assert assess(strict, evidence([130.0], [100.0], ttft=145.0), NOISE).rule == "ttft-guardrail"


def test_threshold_policy_decides_on_one_run() -> None:
    spec = VerdictSpec(policy="threshold", threshold_pct=2.0)
    assert assess(spec, evidence([102.5], [100.0]), NOISE).status == "keep"
    assert assess(spec, evidence([101.5], [100.0]), NOISE).status == "discard"


def test_noise_model_learns_from_repeated_boots_but_keeps_its_prior() -> None:
    quiet = learn(
        prior_boot_cv=0.05, prior_run_cv=0.02, prior_weight=8, boot_groups=[], run_groups=[]
    )
    assert quiet.boot_cv == pytest.approx(0.05)
    groups = [[100.0 * math.exp(0.01 * i) for i in (-1, 0, 1)] for _ in range(20)]
    ss, dof = pooled(groups)
    assert dof == 40 and ss == pytest.approx(20 * 2 * 0.01**2)
    learned = learn(
        prior_boot_cv=0.05, prior_run_cv=0.02, prior_weight=8, boot_groups=groups, run_groups=[]
    )
    assert 0.01 < learned.boot_cv < 0.03 and learned.boot_dof == 40


def test_posterior_is_skeptical_of_small_gains_and_sure_of_big_ones() -> None:
    small = posterior(math.log(1.02), 0.05, prior_null=0.5, prior_sd=0.05)
    big = posterior(math.log(1.30), 0.03, prior_null=0.5, prior_sd=0.05)
    assert small.p_above(0.0) < 0.5
    assert big.p_above(0.0) > 0.99


def test_objective_sums_cells_and_averages_repeats() -> None:
    cells = [cell(100.0), cell(110.0), cell(50.0, name="prose-c8")]
    assert objective(cells) == pytest.approx(155.0)
