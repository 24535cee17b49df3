"""Priors that learn (issue #18): each knob's effect prior updated by the ledger's measurements,
shown to the proposers, the digest and ``orchestrate status``; first looks for every knob."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from agents.context import HistoryEntry, ProposalContext
from agents.digest import digest
from agents.first_looks import eligible, expected_gain, first_look, step_back, why
from knobs import KnobSpace, catalog
from knobs.spec import EffectPrior
from knobs.vocabulary import Kind, State, Status
from ledger import Ledger, VerdictRecord
from orchestrator.policy import overshot
from orchestrator.priors import (
    Measured,
    distinct,
    interacting,
    knob_priors,
    learn,
    learned_prior,
    measured,
)
from orchestrator.profile import Profile
from tests.fixtures.rounds import a_round

SPACE = KnobSpace(knobs=catalog("vllm-dflash2"))
CATALOG_NULL = 0.7  # max_num_batched_tokens and the adapter rank: "rarely matter"


def profile() -> Profile:
    return Profile.model_validate(
        {
            "name": "sim",
            "model": "sim",
            "cluster": {
                "name": "c",
                "nodes": [{"rank": 0, "host": "127.0.0.1", "workdir": "/nonexistent"}],
            },
            "launcher": {"argv": ["true"]},
            "knob_catalog": "vllm-dflash2",
            "cells": [{"name": "c1", "category": "code", "concurrency": 1}],
        }
    )


def test_a_flat_knob_measured_plus_ten_percent_twice_is_judged_as_one_that_matters() -> None:
    card = EffectPrior(p_null=CATALOG_NULL, effect_pct=15.0)
    confirmed = 0.05 * math.sqrt(1 / 4 + 1 / 4)  # a keep's error: four boots a side
    learned = learn(card, [(math.log(1.10), confirmed)] * 2)
    assert learned.p_null < CATALOG_NULL - 0.15
    assert "learned from 2 measured change(s)" in learned.source
    strong = learn(card, [(math.log(0.85), 0.058), (math.log(1.10), confirmed)] * 2)
    assert strong.p_null < 0.4


def test_looks_at_one_change_are_said_as_looks_not_as_changes() -> None:
    """Three looks at one kv dtype change read "learned from 3 measured change(s)": a person
    took the knob for one measured three ways. The looks are still each learned from (pooling
    them was tried and not kept: docs/benchmarks.md); the words say what they are."""
    looks = [
        Measured(i, "kv_cache_dtype", "auto", "champ", g, 0.05)
        for i, g in ((3, 0.086), (4, 0.023), (5, -0.009))
    ]
    assert distinct(looks) == 1
    assert distinct([*looks, Measured(6, "kv_cache_dtype", "auto", "other", 0.0, 0.05)]) == 2
    priors = knob_priors(profile(), looks)
    assert "learned from 3 look(s) at 1 measured change(s) on this cluster" in (
        priors["kv_cache_dtype"].source
    )
    card = EffectPrior(p_null=CATALOG_NULL, effect_pct=15.0)
    assert "learned from 2 measured change(s)" in learn(card, [(0.1, 0.05)] * 2, changes=2).source


def test_a_knob_measured_null_many_times_keeps_a_high_p_null() -> None:
    card = EffectPrior(p_null=CATALOG_NULL, effect_pct=15.0)
    assert learn(card, [(0.0, 0.058)] * 10).p_null > CATALOG_NULL
    k = EffectPrior(p_null=0.05, effect_pct=15.0)  # a card's "always matters", measured flat
    assert learn(k, [(0.0, 0.058)] * 10).p_null > 0.3
    assert learn(card, []) == card  # nothing measured: the card's


def _ledger_with_changes(path: Path, counters: float | None = None) -> tuple[Ledger, int]:
    ledger = Ledger(f"sqlite:///{path}/ledger.db")
    rnd = a_round(ledger, "c")
    base = SPACE.default_config()
    last = 0
    for i, value in enumerate((4096, 4608, 5120)):
        e = ledger.add_experiment(
            cluster="c",
            round_id=rnd.id,
            kind=Kind.CANDIDATE,
            config=base.apply(SPACE.change(base, "max_num_batched_tokens", value)),
            champion_key=base.key,
            champion_objective=100.0,
            knob="max_num_batched_tokens",
            value=value,
        )
        last = e.id
        if i == 2:
            break  # the one being judged: not decided
        stats: dict[str, object] = {"delta_pct": 10.0, "g": math.log(1.1), "se": 0.035}
        if counters is not None:  # what the acceptance counters said of it
            stats.update(acceptance_shift=counters, acceptance_se=0.004)
        ledger.decide(
            e.id,
            verdict=VerdictRecord(status=Status.KEEP, rule="posterior", reason="r", stats=stats),
            objective=110.0,
            delta_pct=10.0,
            accept_len=None,
        )
    return ledger, last


def test_the_experiment_being_judged_is_not_in_its_own_prior(tmp_path: Path) -> None:
    ledger, judged = _ledger_with_changes(tmp_path)
    with ledger:
        changes = measured(ledger, ledger.experiments(cluster="c"), profile().cells)
        assert judged not in {m.experiment for m in changes} and len(changes) == 2
        assert ledger.experiment(judged).state != State.DECIDED
        prior = learned_prior(profile(), ledger, "max_num_batched_tokens")
        assert prior is not None and prior.p_null < CATALOG_NULL - 0.15
        priors = knob_priors(profile(), changes)
        assert priors["max_num_batched_tokens"] == prior
        assert priors["cuda_graphs"] == SPACE.spec("cuda_graphs").effect_prior
        assert not interacting(changes)  # one champion: nothing to compare


def test_what_the_counters_explain_teaches_a_knob_nothing(tmp_path: Path) -> None:
    """Two changes measured +10 % whose acceptance counters said +10 %: the knob's changes did
    what their counters say and nothing more, so the verdict's prior (the null it weighs
    against the counters' shift) stays a knob that rarely does more, while the proposers'
    (what its changes do to the objective) learns that it matters; counters that said +2 %
    leave +8 % to learn from."""
    ledger, _ = _ledger_with_changes(tmp_path, counters=math.log(1.1))
    with ledger:
        changes = measured(ledger, ledger.experiments(cluster="c"), profile().cells)
        assert [round(m.beyond[0], 6) for m in changes] == [0.0, 0.0]
        assert all(m.beyond[1] == pytest.approx(math.hypot(0.035, 0.004)) for m in changes)
        prior = learned_prior(profile(), ledger, "max_num_batched_tokens", beyond=True)
        assert prior is not None and prior.p_null > CATALOG_NULL
        # what the knob's changes do to the objective: they matter (the proposers' promise)
        promise = knob_priors(profile(), changes)["max_num_batched_tokens"]
        assert promise.p_null < CATALOG_NULL - 0.15
        assert learned_prior(profile(), ledger, "max_num_batched_tokens") == promise
    other = tmp_path / "other"
    other.mkdir()
    ledger, _ = _ledger_with_changes(other, counters=math.log(1.02))
    with ledger:
        changes = measured(ledger, ledger.experiments(cluster="c"), profile().cells)
        assert all(m.beyond[0] == pytest.approx(math.log(1.1 / 1.02)) for m in changes)
        prior = learned_prior(profile(), ledger, "max_num_batched_tokens", beyond=True)
        assert prior is not None and prior.p_null < CATALOG_NULL


def context(priors: dict[str, EffectPrior]) -> ProposalContext:
    return ProposalContext(
        space=SPACE,
        champion=SPACE.default_config(),
        champion_objective=100.0,
        history=(),
        known_bad=(),
        decided_keys=frozenset(),
        budget_left=40,
        seed=0,
        knob_priors=priors,
    )


def test_every_knob_gets_a_look_and_a_learned_flat_knob_comes_after_a_learned_strong_one() -> None:
    assert set(eligible(context({}))) == set(SPACE.names)
    strong = EffectPrior(p_null=0.2, effect_pct=15.0, source="learned")
    flat = EffectPrior(p_null=0.95, effect_pct=5.0, source="learned")
    ctx = context({"max_num_batched_tokens": strong, "num_speculative_tokens": flat})
    first = first_look(ctx, ctx.candidates(), 0)
    assert first is not None and first[0] == "cuda_graphs"  # 5 % null, as its card says
    graphs = {ctx.champion.apply(c).key for c in ctx.candidates() if c.knob == "cuda_graphs"}
    ctx = ctx.model_copy(update={"decided_keys": frozenset(graphs)})
    first = first_look(ctx, ctx.candidates(), 0)
    assert first is not None and first[0] == "max_num_batched_tokens"
    order = []
    for _ in SPACE.names:
        first = first_look(ctx, ctx.candidates(), 0)
        if first is None:
            break
        order.append(first[0])
        done = {ctx.champion.apply(c).key for c in ctx.candidates() if c.knob == first[0]}
        ctx = ctx.model_copy(update={"decided_keys": ctx.decided_keys | done})
    assert order[0] == "max_num_batched_tokens" and order[-1] == "num_speculative_tokens"


def test_a_knob_whose_turn_a_keep_took_still_gets_its_look_under_the_next_champion() -> None:
    """Under the first champion a keep came before two knobs had their look (and a person
    vetoed one of them): under the new champion they get it, while a knob looked at already
    and not interacting with the keep does not."""
    first = SPACE.default_config()
    graphs = first.apply(next(c for c in context({}).candidates() if c.knob == "cuda_graphs"))
    looked = [
        ("max_num_batched_tokens", Status.DISCARD),
        ("drafter_adapter_rank", Status.DISCARD),
        ("kv_cache_dtype", Status.VETOED),
        ("cuda_graphs", Status.KEEP),
    ]
    history = [
        HistoryEntry(
            experiment=1, config=dict(first), knob=None, value=None, status=Status.KEEP,
            objective=100.0, delta_pct=0.0, champion_key=first.key,
        )
    ]  # fmt: skip
    for i, (knob, status) in enumerate(looked, start=2):
        value = graphs[knob] if knob == "cuda_graphs" else SPACE.spec(knob).domain()[0]
        history.append(
            HistoryEntry(
                experiment=i,
                config=dict(first) | {knob: value},
                knob=knob,
                value=value,
                status=status,
                objective=None if status == Status.VETOED else 100.0,
                delta_pct=None if status == Status.VETOED else 0.0,
                champion_key=first.key,
            )
        )
    ctx = context({}).model_copy(update={"champion": graphs, "history": tuple(history)})
    assert set(eligible(ctx)) == {
        "num_speculative_tokens",  # a sweep under every champion (and it interacts)
        "cuda_graphs",
        "kv_cache_dtype",  # vetoed: no look
        "gpu_memory_utilization",
    }
    assert why(ctx, "gpu_memory_utilization") == "it has had no look yet"
    look = first_look(ctx, ctx.candidates(), 0)
    assert look is not None and look[0] in eligible(ctx)


def _look(i: int, knob: str, value: object, went_too_far: bool) -> HistoryEntry:
    first = SPACE.default_config()
    return HistoryEntry(
        experiment=i, config=dict(first) | {knob: value}, knob=knob, value=value,
        status=Status.DISCARD, objective=90.0, delta_pct=-10.0, champion_key=first.key,
        overshot=went_too_far,
    )  # fmt: skip


def test_a_look_that_went_too_far_gets_a_step_back_and_one_that_did_nothing_does_not() -> None:
    """The GPU round: 16 slots → 4 broke time to first token, and 8 (the winner) never had a
    look. An ordered knob whose one look went too far gets one more, halfway back."""
    base = SPACE.default_config()
    assert base["drafter_adapter_rank"] == 64 and base["max_num_batched_tokens"] == 7168
    history = (
        HistoryEntry(
            experiment=1, config=dict(base), knob=None, value=None, status=Status.KEEP,
            objective=100.0, delta_pct=0.0, champion_key=base.key,
        ),
        _look(2, "drafter_adapter_rank", 0, went_too_far=True),
        _look(3, "max_num_batched_tokens", 2048, went_too_far=False),  # not worth a change
    )  # fmt: skip
    ctx = context({}).model_copy(update={"history": history})
    assert step_back(ctx) == {"drafter_adapter_rank": (0, 32)}  # 64 → 0 went too far: 32
    knobs = eligible(ctx)
    assert knobs.get("drafter_adapter_rank") is False and "max_num_batched_tokens" not in knobs
    assert why(ctx, "drafter_adapter_rank").endswith("a step back to 32")
    seen: dict[str, list[object]] = {}
    while (first := first_look(ctx, ctx.candidates(), 0)) is not None:
        seen[first[0]] = [c.new for c in first[1]]
        done = {ctx.champion.apply(c).key for c in first[1]}
        ctx = ctx.model_copy(update={"decided_keys": ctx.decided_keys | done})
    assert seen["drafter_adapter_rank"] == [32] and "max_num_batched_tokens" not in seen
    # the step back taken (and gone too far as well): no third look
    ctx = ctx.model_copy(
        update={"history": (*history, _look(4, "drafter_adapter_rank", 32, went_too_far=True))}
    )
    assert step_back(ctx) == {} and "drafter_adapter_rank" not in eligible(ctx)
    # a look one step away has nothing between: 7168 → 6656 went too far, no step back
    one_step = _look(5, "max_num_batched_tokens", 6656, went_too_far=True)
    ctx = ctx.model_copy(update={"history": (*history[:1], one_step)})
    assert step_back(ctx) == {}


def test_a_step_back_promises_as_a_knob_that_does_something_and_goes_first() -> None:
    """The fourth GPU round: 16 slots → 4 broke time to first token on boot 9, and the step
    back to 8 (the brute force's best) waited behind five knobs never looked at until boot
    17. A look that went too far shows that the knob does something under this champion: its
    step back promises what the knob's changes do when they do anything (``p_null`` 0), so it
    comes before knobs whose prior still says most of their changes do nothing."""
    base = SPACE.default_config()
    history = (
        HistoryEntry(
            experiment=1, config=dict(base), knob=None, value=None, status=Status.KEEP,
            objective=100.0, delta_pct=0.0, champion_key=base.key,
        ),
        _look(2, "drafter_adapter_rank", 0, went_too_far=True),
    )  # fmt: skip
    ctx = context({}).model_copy(update={"history": history})
    back = ctx.space.change(base, "drafter_adapter_rank", 32)
    tau = math.log1p(ctx.prior("drafter_adapter_rank").effect_pct / 100)  # type: ignore[union-attr]
    assert expected_gain(ctx, back, None) == pytest.approx(tau / math.sqrt(2 * math.pi))
    calm = ctx.model_copy(
        update={"history": (history[0], _look(2, "drafter_adapter_rank", 0, False))}
    )
    assert expected_gain(calm, back, None) == pytest.approx(
        (1 - CATALOG_NULL) * tau / math.sqrt(2 * math.pi)
    )
    order = []
    while (first := first_look(ctx, ctx.candidates(), 0)) is not None:
        order.append(first[0])
        done = {ctx.champion.apply(c).key for c in first[1]}
        ctx = ctx.model_copy(update={"decided_keys": ctx.decided_keys | done})
    assert order[0] == "drafter_adapter_rank"  # before: last, behind every never-looked knob
    assert set(order) == set(SPACE.names)


def test_what_counts_as_going_too_far() -> None:
    assert overshot("ttft-guardrail", {}) and overshot("errors", {})
    assert overshot("posterior", {"g": -0.2, "se": 0.05})  # worse
    assert not overshot("posterior", {"g": -0.01, "se": 0.05})  # not worth a change
    assert not overshot("futility", {"g": -0.2, "se": 0.05})  # out of boots: a second look's
    assert not overshot("posterior", {})  # a verdict older than its stats


def test_the_digest_shows_the_priors_in_force() -> None:
    learned = EffectPrior(p_null=0.3, effect_pct=9.0, source="learned from 2 measured change(s)")
    text = digest(context({"drafter_adapter_rank": learned}))
    assert "prior in force: 30% of its changes do nothing, the rest ±9.0% (learned from 2" in text
