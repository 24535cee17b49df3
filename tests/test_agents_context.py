"""The context a proposer sees: history records, known-bad regions, and what is allowed."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from agents import HistoryEntry, KnownBad, ProposalContext
from knobs import Change, Config, ForbiddenCombination, KnobSpace, catalog

SPACE = KnobSpace(
    knobs=catalog("vllm-dflash2"),
    forbidden=(
        ForbiddenCombination(
            when={"cuda_graphs": True, "num_speculative_tokens": 7},
            reason="batch-descriptor collision pins acceptance at 1.00",
        ),
    ),
)
CHAMPION = SPACE.default_config()


def context(
    *,
    decided: frozenset[str] = frozenset(),
    known_bad: tuple[KnownBad, ...] = (),
    history: tuple[HistoryEntry, ...] = (),
) -> ProposalContext:
    return ProposalContext(
        space=SPACE,
        champion=CHAMPION,
        champion_objective=100.0,
        history=history,
        known_bad=known_bad,
        decided_keys=decided,
        budget_left=5,
        seed=0,
    )


def change(knob: str, new: object) -> Change:
    return Change.model_validate({"knob": knob, "old": CHAMPION[knob], "new": new})


def test_a_valid_untried_change_is_allowed() -> None:
    assert context().allowed(change("num_speculative_tokens", 5)) is None


@pytest.mark.parametrize(
    ("knob", "new", "reason"),
    [
        ("num_speculative_tokens", 9, "is not an integer from 1 to 7"),
        ("max_num_batched_tokens", 7000, "in steps of 512"),
        ("num_speculative_tokens", 5.0, "write 5.0 as 5"),
        ("kv_cache_dtype", "fp8_e4m3", "already the champion's value"),
        ("no_such_knob", 1, "unknown knob 'no_such_knob'"),
        ("cuda_graphs", True, "forbidden combination cuda_graphs=true, num_speculative_tokens=7"),
    ],
)
def test_an_invalid_change_is_refused_with_the_validation_message(
    knob: str, new: object, reason: str
) -> None:
    stale_safe = Change.model_validate({"knob": knob, "old": CHAMPION.get(knob, 0), "new": new})
    refused = context().refusal(stale_safe)
    assert refused is not None
    assert refused.kind == "invalid"
    assert reason in refused.reason


def test_a_stale_change_is_refused() -> None:
    stale = Change(knob="num_speculative_tokens", old=6, new=5)
    reason = context().allowed(stale)
    assert reason == "stale change: the champion's num_speculative_tokens is 7, not 6"


def test_a_config_decided_under_this_champion_is_refused() -> None:
    move = change("num_speculative_tokens", 5)
    ctx = context(decided=frozenset({CHAMPION.apply(move).key}))
    refused = ctx.refusal(move)
    assert refused is not None and refused.kind == "decided"
    assert "already decided under this champion" in refused.reason
    assert ctx.allowed(change("num_speculative_tokens", 4)) is None


def test_a_change_into_a_known_bad_region_is_refused_and_names_the_region() -> None:
    oom = KnownBad(when={"gpu_memory_utilization": 0.9}, reason="OOM on the head", source="crash")
    reason = context(known_bad=(oom,)).allowed(change("gpu_memory_utilization", 0.9))
    assert reason == (
        "gpu_memory_utilization 0.85 → 0.9 enters a known-bad region: "
        "gpu_memory_utilization=0.9 (crash: OOM on the head)"
    )


def test_known_bad_matching_tells_booleans_from_integers() -> None:
    region = KnownBad(when={"num_speculative_tokens": 1}, reason="r", source="veto")
    assert region.matches({"num_speculative_tokens": 1, "cuda_graphs": True})
    assert not region.matches({"num_speculative_tokens": True})
    assert not region.matches({"cuda_graphs": True})
    assert KnownBad(when={"gpu_memory_utilization": 0.9}, reason="r", source="crash").matches(
        {"gpu_memory_utilization": 0.9}
    )


def test_known_bad_needs_a_region_and_a_known_source() -> None:
    with pytest.raises(ValidationError):
        KnownBad(when={}, reason="everything", source="crash")
    with pytest.raises(ValidationError):
        KnownBad.model_validate({"when": {"x": 1}, "reason": "r", "source": "hunch"})


def test_a_known_bad_region_can_bound_numeric_knobs_on_one_side() -> None:
    above = KnownBad(at_least={"gpu_memory_utilization": 0.9}, reason="oom", source="crash")
    below = KnownBad(at_most={"max_num_batched_tokens": 2048}, reason="kv", source="crash")
    coupled = KnownBad(
        when={"kv_cache_dtype": "auto"},
        at_most={"gpu_memory_utilization": 0.85},
        reason="kv_capacity",
        source="crash",
    )
    assert [above.matches({"gpu_memory_utilization": v}) for v in (0.89, 0.9, 0.95)] == [
        False,
        True,
        True,
    ]
    assert [below.matches({"max_num_batched_tokens": v}) for v in (1024, 2048, 2560)] == [
        True,
        True,
        False,
    ]
    assert [
        coupled.matches({"kv_cache_dtype": dtype, "gpu_memory_utilization": gmu})
        for dtype, gmu in (("auto", 0.8), ("auto", 0.85), ("auto", 0.9), ("fp8_e4m3", 0.8))
    ] == [True, True, False, False]
    assert not above.matches({"gpu_memory_utilization": True})
    assert not above.matches({"cuda_graphs": True})
    assert above.describe() == "gpu_memory_utilization>=0.9 (crash: oom)"
    assert below.region() == "max_num_batched_tokens<=2048"
    assert coupled.region() == "kv_cache_dtype=auto, gpu_memory_utilization<=0.85"
    assert coupled.constrains("gpu_memory_utilization") and not coupled.constrains("k")


def test_candidates_are_the_allowed_neighbours_in_order() -> None:
    first = SPACE.neighbours(CHAMPION)[0]
    ctx = context(decided=frozenset({CHAMPION.apply(first).key}))
    candidates = ctx.candidates()
    assert first not in candidates
    assert candidates == [c for c in SPACE.neighbours(CHAMPION) if c != first]
    assert ctx.refusals(SPACE.neighbours(CHAMPION)) == {"decided": 1}


def test_the_champion_must_assign_exactly_the_spaces_knobs() -> None:
    partial = Config({"num_speculative_tokens": 7})
    with pytest.raises(ValidationError, match="champion does not fit the space"):
        ProposalContext(
            space=SPACE,
            champion=partial,
            champion_objective=None,
            history=(),
            known_bad=(),
            decided_keys=frozenset(),
            budget_left=1,
            seed=0,
        )


def test_history_entries_are_frozen_and_know_their_statuses() -> None:
    entry = HistoryEntry(
        experiment=3,
        config=CHAMPION.as_dict(),
        knob="cuda_graphs",
        value=True,
        status="invalid",
        objective=140.0,
        delta_pct=40.0,
        champion_key=CHAMPION.key,
        failure_class="greedy-mismatch",
    )
    assert not entry.measured  # fast because wrong: never a measurement
    assert entry.describe() == (
        "experiment #3 cuda_graphs=true: invalid, 140.0 (+40.0%) [greedy-mismatch]"
    )
    # an objective as the tables show it (``objective_text``): never ``1.021e+04``
    big = entry.model_copy(update={"objective": 10210.43, "status": "keep"})
    assert big.describe().startswith("experiment #3 cuda_graphs=true: keep, 10210.4 (+40.0%)")
    with pytest.raises(ValidationError):
        entry.objective = 1.0  # type: ignore[misc]
    with pytest.raises(ValidationError):
        HistoryEntry.model_validate({**entry.model_dump(), "status": "maybe"})


def test_risk_names_past_failures_and_known_bad_regions() -> None:
    crash = HistoryEntry(
        experiment=1,
        config=CHAMPION.apply(change("gpu_memory_utilization", 0.93)).as_dict(),
        knob="gpu_memory_utilization",
        value=0.93,
        status="crash",
        objective=None,
        delta_pct=None,
        champion_key=CHAMPION.key,
        failure_class="oom",
    )
    oom = KnownBad(when={"gpu_memory_utilization": 0.93}, reason="OOM", source="crash")
    risk = context(history=(crash,), known_bad=(oom,)).risk_of(
        change("gpu_memory_utilization", 0.92)
    )
    assert (
        "gpu_memory_utilization failed before: experiment #1 gpu_memory_utilization=0.93: "
        "crash [oom]"
    ) in risk
    # the point 0.93 is another value's region: it says nothing of 0.92 (its crash is said
    # above, as a failure of the knob)
    assert "known-bad" not in risk and "0.93 (crash" not in risk
    assert "gpu_memory_utilization=0.92 was never run as a change" in risk


def test_a_risk_line_says_how_each_known_bad_region_it_names_stands_to_the_config() -> None:
    """Only regions that hold the change's new value (or bound it) are named, each with the
    knobs that keep the proposed config out of it; a point region of another value is not
    named, and a region's reason is never its source said again ("invalid: invalid")."""
    elsewhere = CHAMPION.apply(change("max_num_batched_tokens", 4096))
    point = KnownBad(
        when={**elsewhere.apply(change("num_speculative_tokens", 5)).as_dict()},
        reason="invalid",
        source="invalid",
    )
    other = KnownBad(
        when={**elsewhere.apply(change("num_speculative_tokens", 3)).as_dict()},
        reason="greedy outputs differ",
        source="invalid",
    )
    oom = KnownBad(at_least={"gpu_memory_utilization": 0.95}, reason="oom", source="crash")
    ctx = context(known_bad=(point, other, oom))
    risk = ctx.risk_of(change("num_speculative_tokens", 5))
    assert "invalid: invalid" not in risk and "(invalid)" in risk, risk
    assert f"{point.region()} (invalid), outside it by max_num_batched_tokens " in risk, risk
    assert risk.count("known-bad") == 1 and "num_speculative_tokens=3" not in risk, risk
    # the point regions hold other values of K: a change to 4 has none near it
    assert "known-bad" not in ctx.risk_of(change("num_speculative_tokens", 4))
    # a bound the new value does not reach is said as such
    near = ctx.risk_of(change("gpu_memory_utilization", 0.9))
    assert (
        "known-bad regions near it: gpu_memory_utilization>=0.95 (crash: oom), outside it by "
        "gpu_memory_utilization 0.9 (under 0.95)"
    ) in near, near


def test_a_change_the_queue_timeout_vetoed_is_refused_as_nobodys_veto() -> None:
    """Held for the rest of the sitting, a change the queue's timeout vetoed (a vetoed entry
    with no veto region: nobody judged it) is refused as such, not as a person's veto that
    ``known-bad clear`` would lift (the timeout bars no region to clear)."""
    config = CHAMPION.apply(change("num_speculative_tokens", 5))
    held = HistoryEntry(
        experiment=4,
        config=config.as_dict(),
        knob="num_speculative_tokens",
        value=5,
        status="vetoed",
        objective=None,
        delta_pct=None,
        champion_key=CHAMPION.key,
    )
    refused = context(decided=frozenset({config.key}), history=(held,)).refusal(
        change("num_speculative_tokens", 5)
    )
    assert refused is not None
    assert refused.reason == (
        "num_speculative_tokens 7 → 5 was vetoed under this champion by the queue's timeout "
        "(experiment #4: nobody decided it); it may be proposed again once the round resumes"
    )
