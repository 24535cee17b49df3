"""A value judged with its neighbours (issue #18): the other values of an ordered knob measured
against the same champion are evidence about the candidate's effect."""

from __future__ import annotations

import io
import math
import random
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from agents import HistoryEntry, OptunaProposer, ProposalContext, digest
from agents.first_looks import further_look, open_changes, per_boot, untried_promise
from agents.sweep import SweepProposer
from cluster.simulated import SimulatedTestbed
from cluster.twin.landscape import load_landscape
from knobs import KnobSpace, catalog
from knobs.config import Config
from knobs.spec import EffectPrior
from knobs.vocabulary import Kind, Status
from ledger import ExperimentRecord, Ledger, VerdictRecord
from orchestrator.approval import ApprovalGate
from orchestrator.display import RoundDisplay
from orchestrator.intake import look_words
from orchestrator.known_bad import barred_regions
from orchestrator.noise import NoiseModel
from orchestrator.policy import FAIR_TRIAL, look_promise, second_look
from orchestrator.pooling import ValueBoots, pool, position
from orchestrator.posterior import Posterior, Prior, posterior
from orchestrator.profile import Profile
from orchestrator.profile_sections import VerdictSpec
from orchestrator.round import RoundOptions, RoundRunner
from orchestrator.testbed import NullSink
from orchestrator.verdict import BALANCE_LOOKS, Assessment, Evidence, assess

SPACE = KnobSpace(knobs=catalog("vllm-dflash2"))
K = SPACE.spec("num_speculative_tokens")
CV = 0.054
TAU = math.log1p(0.15)


def boots(effect: float, n: int, rng: random.Random, *, level: float = 0.0) -> tuple[float, ...]:
    return tuple(level + effect + rng.gauss(0.0, CV) for _ in range(n))


def p_gain(candidate: ValueBoots, others: list[ValueBoots], champion: list[float]) -> float:
    pooled = pool(K, 7, champion, candidate, others, boot_cv=CV, p_null=0.1, tau=TAU)
    assert pooled is not None
    return pooled.posterior.p_above(0.0)


def test_nothing_to_pool_without_another_value_or_off_the_domain() -> None:
    alone = ValueBoots(4, (0.05,))
    assert pool(K, 7, [0.0], alone, [], boot_cv=CV, p_null=0.1, tau=TAU) is None
    assert position(K, 7) == 1.0 and position(K, 1) == 0.0 and position(K, 99) is None
    dtype = SPACE.spec("kv_cache_dtype")
    assert position(dtype, "auto") is not None and position(dtype, "fp4") is None


def test_a_value_looked_at_again_is_judged_on_all_its_boots() -> None:
    """A second look at CUDA graphs (no order: its values are unrelated) pools exactly as one
    experiment with every boot would be judged."""
    graphs = SPACE.spec("cuda_graphs")
    champion = [0.0, 0.02, -0.01]
    before, now = ValueBoots(True, (0.03,)), ValueBoots(True, (0.05, 0.04))
    pooled = pool(graphs, False, champion, now, [before], boot_cv=CV, p_null=0.1, tau=TAU)
    assert pooled is not None and pooled.values == 1 and pooled.boots == 1
    g = (0.03 + 0.05 + 0.04) / 3 - sum(champion) / 3
    plain = posterior(g, CV * math.sqrt(1 / 3 + 1 / 3), Prior(p_null=0.1, sd=TAU))
    assert pooled.posterior.p_effect == pytest.approx(plain.p_effect, rel=1e-6)
    assert pooled.posterior.mean == pytest.approx(plain.mean, rel=1e-6)
    assert pooled.posterior.sd == pytest.approx(plain.sd, rel=1e-6)


def test_neighbours_that_gained_lift_a_value_that_measured_a_little_and_losers_sink_it() -> None:
    """K 7 → 4 measured +4 % on one boot: on its own P(gain) is a coin toss; with K 3, 5 and 2
    measured +10 % on two boots each against the same champion it is much higher; with them
    at −10 % it is lower."""
    champion = [0.0, 0.01, -0.01]
    candidate = ValueBoots(4, (math.log(1.04),))
    alone = posterior(math.log(1.04), CV * math.sqrt(1 + 1 / 3), Prior(p_null=0.1, sd=TAU))
    up = [ValueBoots(v, (math.log(1.10),) * 2) for v in (3, 5, 2)]
    down = [ValueBoots(v, (math.log(0.90),) * 2) for v in (3, 5, 2)]
    assert 0.5 < alone.p_above(0.0) < 0.65
    assert p_gain(candidate, up, champion) > alone.p_above(0.0) + 0.2
    assert p_gain(candidate, down, champion) < alone.p_above(0.0) - 0.15


def test_the_champions_error_is_counted_once() -> None:
    """Every contrast shares the champion's mean. Every value of K measured +6 % on twelve
    boots each against a champion of two boots reads as the champion measured low, not as a
    knob that matters; against a champion of thirty boots the same contrasts are a gain."""
    many = [ValueBoots(v, (math.log(1.06),) * 12) for v in (1, 2, 3, 5, 6)]
    candidate = ValueBoots(4, (math.log(1.06),) * 12)

    def pooled_at(m: int) -> Posterior:
        pooled = pool(K, 7, [0.0] * m, candidate, many, boot_cv=CV, p_null=0.1, tau=TAU)
        assert pooled is not None and pooled.values == 5 and pooled.boots == 60
        return pooled.posterior

    assert pooled_at(2).p_effect < 0.3 < 0.99 < pooled_at(30).p_effect
    assert pooled_at(2).p_above(0.0) < 0.3 < 0.99 < pooled_at(30).p_above(0.0)


def test_a_knob_whose_neighbours_disagree_is_judged_value_by_value() -> None:
    """Values alternating −10 % / +10 % say the knob is not smooth: the short length scales
    explain them, and the candidate keeps its own measurement rather than its neighbours'."""
    rng = random.Random(3)
    effects = {1: -0.1, 2: 0.1, 3: -0.1, 5: -0.1, 6: 0.1}
    others = [ValueBoots(v, boots(e, 3, rng)) for v, e in effects.items()]
    champion = list(boots(0.0, 4, rng))
    candidate = ValueBoots(4, boots(0.1, 3, rng))
    pooled = pool(K, 7, champion, candidate, others, boot_cv=CV, p_null=0.1, tau=TAU)
    assert pooled is not None
    own = sum(candidate.logs) / 3 - sum(champion) / 4
    assert abs(pooled.posterior.mean - own) < 0.04 and pooled.posterior.mean > 0.05


def test_pooling_is_calibrated_where_the_knob_is_smooth() -> None:
    """Drawn from the model's own kind of world (a smooth effect over K, the noise the verdict
    assumes): of the candidates pooled P(gain) calls ≥ 0.9, at least 85 % truly gain."""
    rng = random.Random(11)
    called, right = 0, 0
    for _ in range(300):
        slope = rng.gauss(0.0, 0.04)  # per K step, towards lower K
        truth = {v: slope * (7 - v) for v in (1, 2, 3, 4, 5, 6)}
        champion = list(boots(0.0, 3, rng))
        others = [ValueBoots(v, boots(truth[v], 1, rng)) for v in (3, 5, 2)]
        candidate = ValueBoots(4, boots(truth[4], 1, rng))
        if p_gain(candidate, others, champion) >= 0.9:
            called += 1
            right += truth[4] > 0
    assert called >= 30 and right / called >= 0.85


def test_a_cliff_on_one_side_of_the_champion_says_little_of_the_other_side() -> None:
    """The champion at a cliff's edge: every K below it −10 %, K above it doing nothing. A trend
    through the champion would read the cliff as a gain above it; the kink at the champion
    (each side its own curve) weighs against that, so K 5's pooled P(gain) stays near what the
    values above the champion alone say (the cliff still says the knob matters)."""
    rng = random.Random(7)
    truth = {1: -0.1, 2: -0.1, 3: -0.1, 5: 0.0, 6: 0.0}
    lift = []
    for _ in range(200):
        champion = list(boots(0.0, 4, rng))
        others = [ValueBoots(v, boots(truth[v], 2, rng)) for v in (1, 2, 3, 6)]
        candidate = ValueBoots(5, boots(truth[5], 1, rng))
        both = pool(K, 4, champion, candidate, others, boot_cv=CV, p_null=0.1, tau=TAU)
        above = [o for o in others if isinstance(o.value, int) and o.value > 4]
        one = pool(K, 4, champion, candidate, above, boot_cv=CV, p_null=0.1, tau=TAU)
        assert both is not None and one is not None
        lift.append(both.posterior.p_above(0.0) - one.posterior.p_above(0.0))
    assert sum(lift) / len(lift) < 0.25


def test_a_trend_through_the_champion_still_carries_across_it() -> None:
    """K's effect one slope through the champion (K 4): K 5, 6 and 2 measured once each, K 3 is
    judged with them; of the candidates pooled P(gain) calls ≥ 0.9, every one truly gains."""
    rng = random.Random(11)
    called, right = 0, 0
    for _ in range(400):
        slope = rng.gauss(0.0, 0.04)
        truth = {v: slope * (4 - v) for v in range(1, 8)}
        champion = list(boots(0.0, 3, rng))
        others = [ValueBoots(v, boots(truth[v], 1, rng)) for v in (5, 6, 2)]
        candidate = ValueBoots(3, boots(truth[3], 1, rng))
        pooled = pool(K, 4, champion, candidate, others, boot_cv=CV, p_null=0.1, tau=TAU)
        assert pooled is not None
        if pooled.posterior.p_above(0.0) >= 0.9:
            called += 1
            right += truth[3] > 0
    assert called >= 30 and right == called


def profile_data(tmp: Path, *knobs: dict[str, object]) -> dict[str, Any]:
    """The simulated ``far-k`` stack's profile as a file holds it, with ``knobs`` added to its
    catalog's."""
    landscape = load_landscape("far-k")
    return {
        "name": "sim-far-k",
        "model": "sim",
        "cluster": {
            "name": "sim-far-k",
            "nodes": [{"rank": 0, "host": "127.0.0.1", "workdir": str(tmp)}],
        },
        "launcher": {"argv": ["true"]},
        "knob_catalog": landscape.catalog,
        "knobs": list(knobs),
        "cells": [c.model_dump() for c in landscape.cells()],
        "proposer": {"kind": "sweep"},
    }


def profile(tmp: Path, *knobs: dict[str, object]) -> Profile:
    """The simulated ``far-k`` stack's profile, with ``knobs`` added to its catalog's."""
    return Profile.model_validate(profile_data(tmp, *knobs))


def sweep_round(
    tmp: Path, knob: str, values: tuple[int, ...], *, seed: int
) -> tuple[list[ExperimentRecord], list[VerdictRecord | None]]:
    """A round on the simulated ``far-k`` stack that looks at ``values`` of ``knob`` in turn:
    its candidates and their verdicts."""
    return sweep_entries(tmp, [{knob: v} for v in values], seed=seed)


def sweep_entries(
    tmp: Path,
    entries: list[dict[str, int]],
    *,
    seed: int,
    knobs: tuple[dict[str, object], ...] = (),
) -> tuple[list[ExperimentRecord], list[VerdictRecord | None]]:
    """A round on the simulated ``far-k`` stack (its profile with ``knobs`` added) that walks
    ``entries`` (one-knob changes of the champion of the moment), in the ledger
    ``tmp/ledger.db``: its candidates and their verdicts."""
    with Ledger(f"sqlite:///{tmp}/ledger.db") as ledger:
        runner = RoundRunner(
            profile(tmp, *knobs),
            ledger,
            NullSink(),
            SimulatedTestbed(load_landscape("far-k"), seed),
            SweepProposer(entries),
            ApprovalGate(ledger, "auto"),
            RoundDisplay(Console(file=io.StringIO())),
        )
        runner.run(RoundOptions(budget=len(entries), proposer="sweep", approve="auto", seed=seed))
        judged = [e for e in ledger.experiments() if e.kind == Kind.CANDIDATE]
        return judged, [ledger.verdict(e.id) for e in judged]


def test_a_round_judges_a_value_with_the_values_measured_before_it(tmp_path: Path) -> None:
    """K 6, 5 and 4 against the default champion (K 7), in that order, on the simulated stack
    whose best K is far from the card's: each later verdict names the values before it, and
    the ledger's stats carry the candidate's own P(gain) beside the pooled one."""
    # seed 19: a draw where K 6 is discarded and K 5 kept
    judged, verdicts = sweep_round(tmp_path, "num_speculative_tokens", (6, 5, 4), seed=19)
    assert [e.value for e in judged] == [6, 5, 4]
    first, second, third = verdicts
    assert first is not None and "pooled_values" not in first.stats
    # K 5 is judged with K 6's boots (the same champion); it was kept, so K 4 is judged
    # against K 5 alone: nothing of K 5's champion's values is pooled into it
    assert second is not None
    assert second.stats["pooled_values"] == 1, second.stats
    assert "with 1 other value(s) of the knob" in second.reason
    assert isinstance(second.stats["own_p_gain"], float)
    # the line says whose P(gain) is whose: the pooled one, and the value's own beside it
    own = f"; this value's boots alone: P(gain)={second.stats['own_p_gain']:.2f}"
    assert f"P(gain)={second.stats['p_gain']:.2f}" in second.reason, second.reason
    assert " pooled with 1 other value(s) of the knob" in second.reason, second.reason
    assert own in second.reason, second.reason
    assert judged[1].status == "keep"
    assert third is not None and "pooled_values" not in third.stats


def test_a_value_measured_before_the_profile_gained_a_knob_is_pooled_with_one_after(
    tmp_path: Path,
) -> None:
    """K 6 is measured, then the profile gains a knob (the champion takes its default), then K 5
    is measured against the same champion: K 6's recorded config lacks the new knob, fitted it
    is the champion's but for K, so K 5 is judged with it as when both ran under one profile."""
    moe: dict[str, object] = {
        "name": "moe_backend",
        "type": "choice",
        "choices": ["triton", "cutlass"],
        "default": "triton",
        "render": {"kind": "env", "env": "MOE_BACKEND"},
    }
    k = "num_speculative_tokens"
    [before], [first] = sweep_entries(tmp_path, [{k: 6}], seed=19)
    assert "moe_backend" not in before.config and before.status != "keep"
    assert first is not None
    judged, verdicts = sweep_entries(tmp_path, [{k: 5}], seed=19, knobs=(moe,))
    assert [e.value for e in judged] == [6, 5] and judged[1].config["moe_backend"] == "triton"
    assert verdicts[1] is not None
    assert verdicts[1].stats["pooled_values"] == 1, verdicts[1].stats


def test_a_value_past_a_guardrail_is_no_point_on_the_curve(tmp_path: Path) -> None:
    """MNBT 7168 → 3072 falls past the stack's time-to-first-token cliff (discarded by the
    guardrail, its speed another regime's), then 8704 and 9728 are measured: 8704 is judged on
    its own boots, 9728 with 8704's alone."""
    judged, verdicts = sweep_round(tmp_path, "max_num_batched_tokens", (3072, 8704, 9728), seed=3)
    assert [e.value for e in judged] == [3072, 8704, 9728]
    first, second, third = verdicts
    assert second is not None and "pooled_values" not in second.stats
    assert [v.rule if v else None for v in (first, second)] == ["ttft-guardrail", "posterior"]
    assert [e.status for e in judged[:2]] == ["discard", "discard"]
    assert third is not None
    assert third.stats["pooled_values"] == 1, third.stats


def test_a_guardrail_declared_monotone_bars_its_side_under_its_champion(tmp_path: Path) -> None:
    """MNBT declares its time-to-first-token guardrail monotone (a smaller MNBT takes a long
    prompt more prefill steps): 7168 → 4096 past the guardrail bars 3072 under the same
    champion, so the sweep skips it with the region's words and measures 8704; the region is
    listed as the guardrail's, pinned to the other knobs' values."""
    mnbt = "max_num_batched_tokens"
    judged, verdicts = sweep_entries(tmp_path, [{mnbt: 4096}, {mnbt: 3072}, {mnbt: 8704}], seed=0)
    assert [e.value for e in judged] == [4096, 8704]
    assert [v.rule if v else None for v in verdicts] == ["ttft-guardrail", "posterior"]
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        skipped = ledger.proposals()[-1].notes["skipped"]
        assert "entry 2 (max_num_batched_tokens=3072)" in skipped, skipped
        assert "max_num_batched_tokens<=4096" in skipped, skipped
        [region] = barred_regions(profile(tmp_path), ledger)
        assert region.experiment.id == judged[0].id and region.region.source == "guardrail"
        assert region.region.at_most == {mnbt: 4096}
        assert region.region.when["num_speculative_tokens"] == 7
        assert region.region.reason.startswith("ttft-guardrail against its champion: TTFT p90")


def test_a_guardrail_region_lifts_when_the_champion_moves(tmp_path: Path) -> None:
    """The guardrail is measured against the champion: after K 7 → 4 is kept, MNBT 3072 is
    no longer barred by 4096's discard under K 7, and is measured against the new champion."""
    mnbt, k = "max_num_batched_tokens", "num_speculative_tokens"
    judged, verdicts = sweep_entries(tmp_path, [{mnbt: 4096}, {k: 4}, {mnbt: 3072}], seed=0)
    assert [(e.knob, e.value, e.status) for e in judged] == [
        (mnbt, 4096, "discard"),
        (k, 4, "keep"),
        (mnbt, 3072, "discard"),
    ]
    assert verdicts[2] is not None and verdicts[2].rule == "ttft-guardrail"
    # what `known-bad list` shows: 3072's region under K 4, not 4096's lifted one under K 7
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        [region] = barred_regions(profile(tmp_path), ledger)
    assert region.experiment.id == judged[2].id
    assert region.region.at_most == {mnbt: 3072}
    assert region.region.when[k] == 4


def test_a_guardrail_discard_above_the_champion_bars_nothing_below_it(tmp_path: Path) -> None:
    """MNBT's time-to-first-token guardrail is declared monotone below a value (a smaller
    batch takes more steps to a first token). A discard of MNBT 9216 above the champion's 7168
    says nothing of the values below it: it bars no region (a bound of ``<= 9216`` barred the
    champion's own value and every smaller one, and the round never booted 6144), while 6144's
    own discard bars ``<= 6144``. The guardrail is set tight (1 %) so that both trip it."""
    mnbt = "max_num_batched_tokens"
    data = profile(tmp_path).model_dump(mode="json", exclude_unset=True)
    data["verdict"] = {"ttft_p90_regression_pct": 1, "ttft_p90_min_increase_ms": 0}
    prof = Profile.model_validate(data)
    assert prof.space.default_config().as_dict()[mnbt] == 7168
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        RoundRunner(
            prof,
            ledger,
            NullSink(),
            SimulatedTestbed(load_landscape("far-k"), 0),
            SweepProposer([{mnbt: 9216}, {mnbt: 6144}]),
            ApprovalGate(ledger, "auto"),
            RoundDisplay(Console(file=io.StringIO())),
        ).run(RoundOptions(budget=2, proposer="sweep", approve="auto", seed=0))
        judged = [e for e in ledger.experiments() if e.kind == Kind.CANDIDATE]
        rules = [v.rule if (v := ledger.verdict(e.id)) else None for e in judged]
        regions = barred_regions(prof, ledger)
    assert [(e.value, e.status) for e in judged] == [(9216, "discard"), (6144, "discard")]
    assert rules == ["ttft-guardrail", "ttft-guardrail"]
    assert [(r.experiment.id, r.region.at_most) for r in regions] == [(judged[1].id, {mnbt: 6144})]


def test_a_change_stopped_for_want_of_boots_gets_second_looks_that_count_its_boots(
    tmp_path: Path,
) -> None:
    """CUDA graphs on the two-node stack: +4.8 % that its first boot measured at +1 %. The
    verdict stops it on futility while its posterior still promises a gain, so the proposer
    looks at it again (a "second look"), each look's verdict pools the earlier looks' boots,
    and no change gets more than 1 + ``second_looks`` looks under one champion."""
    landscape = load_landscape("sm121-2node")
    data = profile(tmp_path).model_dump(mode="json", exclude_unset=True)
    data.update(knob_catalog=landscape.catalog, cells=[c.model_dump() for c in landscape.cells()])
    data["proposer"] = {"kind": "optuna", "seed": 0}
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        prof = Profile.model_validate(data)
        runner = RoundRunner(
            prof,
            ledger,
            NullSink(),
            SimulatedTestbed(landscape, 0),
            OptunaProposer(seed=0),
            ApprovalGate(ledger, "auto"),
            RoundDisplay(Console(file=io.StringIO())),
        )
        runner.run(RoundOptions(budget=6, proposer="optuna", approve="auto", seed=0))
        experiments = [e for e in ledger.experiments() if e.kind == Kind.CANDIDATE]
        proposals = {p.id: p for p in ledger.proposals()}
        verdicts = {e.id: ledger.verdict(e.id) for e in experiments}
    again = [
        e
        for e in experiments
        if e.proposal_id is not None
        and proposals[e.proposal_id].notes.get("sampler") == "second look"
    ]
    assert again, [
        (e.knob, e.value, e.status, proposals[e.proposal_id].notes)
        for e in experiments
        if e.proposal_id
    ]
    assert any(", second look after #" in e.description for e in again)
    for e in again:
        earlier = [x for x in experiments if x.id < e.id and x.config.key == e.config.key]
        assert earlier and all(x.champion_key == e.champion_key for x in earlier)
        assert verdicts[earlier[-1].id].rule in ("futility", "max-boots")  # type: ignore[union-attr]
        v = verdicts[e.id]
        assert v is not None
        pooled_boots = v.stats["pooled_boots"]
        assert isinstance(pooled_boots, int) and pooled_boots >= len(earlier)
    # beyond 1 + ``second_looks`` looks, only a further look (it beat every untried change);
    # each look after the first says which it is wherever the change is shown
    looks: dict[tuple[str | None, str], list[int]] = {}
    for e in experiments:
        seen = looks.setdefault((e.champion_key, e.config.key), [])
        assert f"(optuna{look_words(seen)})" in e.description, e.description
        seen.append(e.id)
        if len(seen) > 1 + prof.verdict.second_looks:
            assert e.proposal_id is not None
            assert proposals[e.proposal_id].notes.get("sampler") == "further look"


def _graphs_open(
    delta_pct: float, priors: dict[str, EffectPrior] | None = None, **look: float
) -> ProposalContext:
    """CUDA graphs looked at under the default champion, measured ``delta_pct``, open for
    another look (``look``: its ``second_look`` or ``further_look``)."""
    champion = SPACE.default_config()
    graphs = champion.apply(SPACE.change(champion, "cuda_graphs", True))
    entry = HistoryEntry(
        experiment=4,
        config=graphs.as_dict(),
        knob="cuda_graphs",
        value=True,
        status=Status.DISCARD,
        objective=100.0 + delta_pct,
        delta_pct=delta_pct,
        champion_key=champion.key,
        **look,
    )
    return ProposalContext(
        space=SPACE,
        champion=champion,
        champion_objective=100.0,
        history=(entry,),
        known_bad=(),
        decided_keys=frozenset({champion.key}),
        budget_left=10,
        seed=0,
        knob_priors=priors or {},
    )


def test_the_digest_lists_what_is_open_for_a_second_look() -> None:
    context = _graphs_open(1.2, second_look=math.log1p(0.026))
    (entry,) = context.history
    text = digest(context)
    assert "## Open for a second look" in text
    assert "- cuda_graphs=true: still promises +2.6% (E[max(0, gain)]), last measured +1.2%" in text
    closed = context.model_copy(
        update={"history": (entry.model_copy(update={"second_look": None}),)}
    )
    assert "second look" not in digest(closed)


def test_a_second_look_only_for_a_change_stopped_for_want_of_boots() -> None:
    spec = VerdictSpec()
    promising = {"post_p_effect": 0.95, "post_mean": 0.02, "post_sd": 0.05}
    flat = {"post_p_effect": 0.2, "post_mean": 0.0, "post_sd": 0.05}
    gain = second_look(spec, "futility", promising, looks=1)
    expected = Posterior(p_effect=0.95, mean=0.02, sd=0.05).expected_gain()
    assert gain is not None and gain == pytest.approx(expected)
    assert gain > math.log1p(spec.second_look_gain_pct / 100)
    # looked at once, then ``second_looks`` times more: no more
    assert second_look(spec, "max-boots", promising, looks=spec.second_looks) is not None
    assert second_look(spec, "max-boots", promising, looks=1 + spec.second_looks) is None
    assert second_look(spec, "posterior", promising, looks=1) is None  # the posterior decided
    assert second_look(spec, "futility", flat, looks=1) is None  # promises too little
    assert second_look(spec, "futility", {"g": 0.01, "se": 0.05}, looks=1) is None  # old ledger
    assert second_look(VerdictSpec(second_looks=0), "futility", promising, looks=1) is None
    # with its second looks spent, it still has a promise (a further look may take it)
    assert look_promise(spec, "max-boots", promising) == pytest.approx(expected)
    assert look_promise(spec, "posterior", promising) is None
    assert look_promise(spec, "futility", flat) is None
    # its fair trial had: twice as many boots of the value over its looks as the champion may
    # be balanced to (``BALANCE_LOOKS`` × ``max_boots``), still undecided — no further look
    tried = FAIR_TRIAL * BALANCE_LOOKS * spec.max_boots
    assert look_promise(spec, "max-boots", {**promising, "value_boots": tried - 1}) is not None
    assert look_promise(spec, "max-boots", {**promising, "value_boots": tried}) is None


def _further_context(p_null: float) -> ProposalContext:
    """CUDA graphs looked at three times under the champion (its second looks spent) while it
    still promises +3 %, and every other knob with the prior ``p_null`` / ±15 %."""
    priors = {s.name: EffectPrior(p_null=p_null, effect_pct=15.0) for s in SPACE.knobs}
    return _graphs_open(1.0, priors, further_look=math.log1p(0.03))


def test_a_further_look_only_when_it_beats_every_untried_change() -> None:
    """Evidence and priors on one scale: a change whose second looks are spent is looked at
    again when what it still promises (its posterior) beats what every change not yet looked
    at promises (its knob's prior in force), and not otherwise."""
    sure_nothing = _further_context(p_null=0.97)  # the priors say what is left does nothing
    allowed = sure_nothing.candidates()
    assert untried_promise(sure_nothing, allowed) < math.log1p(0.03)
    got = further_look(sure_nothing, allowed)
    assert got is not None and got[0].knob == "cuda_graphs" and got[0].new is True
    assert got[1] == pytest.approx(math.log1p(0.03))
    maybe = _further_context(p_null=0.3)  # ±15 % most of the time: an untried change promises more
    assert untried_promise(maybe, maybe.candidates()) > math.log1p(0.03)
    assert further_look(maybe, maybe.candidates()) is None
    text = digest(sure_nothing)
    assert "- cuda_graphs=true: still promises +3.0%" in text
    assert "its second looks are spent" in text
    # the Optuna proposer: the first looks come first, then the further look
    proposal = OptunaProposer(seed=0).propose(sure_nothing)
    assert proposal.notes["sampler"] != "further look"
    champion = sure_nothing.champion
    looked = tuple(
        HistoryEntry(
            experiment=10 + i,
            config=champion.apply(change).as_dict(),
            knob=change.knob,
            value=change.new,
            status=Status.DISCARD,
            objective=99.0,
            delta_pct=-1.0,
            champion_key=champion.key,
        )
        for i, change in enumerate(
            next(c for c in allowed if c.knob == s.name)
            for s in SPACE.knobs
            if s.name != "cuda_graphs"
        )
    )
    done = sure_nothing.model_copy(
        update={
            "history": (*sure_nothing.history, *looked),
            "decided_keys": sure_nothing.decided_keys | {Config(e.config).key for e in looked},
        }
    )
    proposal = OptunaProposer(seed=0).propose(done)
    assert proposal.notes["sampler"] == "further look", proposal.notes
    assert proposal.change.knob == "cuda_graphs" and "+3.0%" in proposal.hypothesis


def test_one_untried_value_that_promises_much_does_not_hold_back_a_further_look() -> None:
    """The `sm121-2node` trace (seed 0, CUDA graphs true +4.8 %): after its second looks,
    graphs still promised +2.4 %, but the KV dtype's one value left promised +2.5 % under its
    prior, so no further look came, and TPE, which picks on no promise, never drew that value
    in thirty experiments (MNBT and the memory fraction, ±1 %, took them all). What a further
    look is weighed against is the next untried change, TPE's pick: the average over the knobs
    left, not the best of them."""
    priors = {s.name: EffectPrior(p_null=0.97, effect_pct=15.0) for s in SPACE.knobs}
    one_hopeful = {**priors, "kv_cache_dtype": EffectPrior(p_null=0.1, effect_pct=15.0)}
    context = _graphs_open(1.0, one_hopeful, further_look=math.log1p(0.03))
    allowed = context.candidates()
    reopened = open_changes(context)
    fresh = [c for c in allowed if context.champion.apply(c).key not in reopened]
    best = max(per_boot(context, [c], None) for c in fresh)
    assert best > math.log1p(0.03)  # the best untried value promises more than the look
    assert untried_promise(context, allowed) < math.log1p(0.03)
    got = further_look(context, allowed)
    assert got is not None and got[0].knob == "cuda_graphs"
    # where every knob left promises more, TPE's pick does too: no further look
    hopeful = {s.name: EffectPrior(p_null=0.1, effect_pct=15.0) for s in SPACE.knobs}
    everywhere = _graphs_open(1.0, hopeful, further_look=math.log1p(0.03))
    assert untried_promise(everywhere, everywhere.candidates()) > math.log1p(0.03)
    assert further_look(everywhere, everywhere.candidates()) is None


def test_a_value_looked_at_again_boots_the_champion_before_it_is_given_up() -> None:
    """The `far-k` trace (seed 0, K 4 → 2, true +5.2 %): eleven looks at K 2 under one
    champion, each one to three boots stopped for futility at pooled P(gain) 0.7–0.89, because
    the posterior's spread was the champion's six boots, which every pooled contrast shares and
    no candidate boot reduces. When the value's boots over its looks outweigh the champion's,
    the champion is booted (up to ``BALANCE_LOOKS`` × ``max_boots`` boots) before the change is
    given up; a first look, or a champion already as well measured, goes on as before."""
    spec = VerdictSpec()
    noise = NoiseModel(boot_cv=CV, run_cv=0.02, boot_dof=0, run_dof=0)
    scatter = (0.03, -0.05, 0.06, -0.02, 0.01, -0.04, 0.05, -0.04, 0.0)

    def judged(champion_boots: int, earlier_looks: int) -> Assessment:
        champion = [0.0 + s / 2 for s in scatter[:champion_boots]]
        others = [
            ValueBoots(3, tuple(0.03 + s for s in scatter[:3])),
            ValueBoots(1, tuple(0.02 + s for s in scatter[3:6])),
        ]
        if earlier_looks:
            others.append(ValueBoots(2, tuple(0.05 + s for s in scatter[:earlier_looks])))
        own = (0.02,)
        pooled = pool(K, 4, champion, ValueBoots(2, own), others, boot_cv=CV, p_null=0.1, tau=TAU)
        assert pooled is not None and pooled.same == earlier_looks
        ev = Evidence(
            candidate=[100 * math.exp(x) for x in own],
            champion=[100 * math.exp(x) for x in champion],
            confirmations=0,
            candidate_cells=[],
            champion_cells=[],
        )
        return assess(spec, ev, noise, EffectPrior(p_null=0.1, effect_pct=15.0), pooled)

    again = judged(champion_boots=6, earlier_looks=8)
    assert again.status == "more" and again.next_boot == "champion", again.reason
    assert "over 9 boots of this value, the champion measured again" in again.reason
    # the value's own earlier looks are named apart from the knob's other values
    assert (
        "with its earlier look(s) at this value (8 boot(s)) and 2 other value(s) of the knob "
        "(6 boots)" in again.reason
    ), again.reason
    # the champion as well measured as the value's side allows (BALANCE_LOOKS × max_boots)
    enough = judged(champion_boots=BALANCE_LOOKS * spec.max_boots, earlier_looks=8)
    assert enough.next_boot != "champion", enough.reason
    # a first look at the value: the champion's boots are not outweighed
    first = judged(champion_boots=6, earlier_looks=0)
    assert first.next_boot != "champion", first.reason
