"""The hybrid proposer: Claude picks the knob and direction (through the real SDK and the
local Messages API server), TPE picks the value inside them."""

from __future__ import annotations

from typing import Any

import pytest

from agents import (
    ChampionCell,
    ClaudeOptions,
    HybridProposer,
    KnownBad,
    OptunaProposer,
    ProposalContext,
)
from agents.draft_model import predict
from cluster.twin.landscape import load_landscape
from knobs import KnobSpace, catalog
from knobs.config import Config
from tests.fixtures.messages_api import MessagesApi, overloaded, tool_use

SPACE = KnobSpace(knobs=catalog("vllm-dflash2"))
CHAMPION = SPACE.default_config()


def context(known_bad: tuple[KnownBad, ...] = ()) -> ProposalContext:
    return ProposalContext(
        space=SPACE,
        champion=CHAMPION,
        champion_objective=1000.0,
        history=(),
        known_bad=known_bad,
        decided_keys=frozenset(),
        budget_left=3,
        seed=0,
    )


def choice(**fields: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "knob": "max_num_batched_tokens",
        "direction": "up",
        "hypothesis": "Larger prefill chunks should cut the 8k cliff.",
        "expected_direction": "higher",
        "expected_size_pct": 4,
        "risk": "medium: TTFT may grow",
        "estimated_cost": "1 boot",
    }
    data.update(fields)
    return data


def hybrid(api: MessagesApi, **options: Any) -> HybridProposer:
    options.setdefault("api_retries", 0)
    return HybridProposer(
        ClaudeOptions(**options), optuna=OptunaProposer(seed=0, n_startup=0), base_url=api.url
    )


def test_claude_picks_the_knob_and_direction_and_tpe_the_value(
    messages_api: MessagesApi,
) -> None:
    messages_api.script(tool_use(choice(), name="choose_knob"))
    proposal = hybrid(messages_api).propose(context())
    assert proposal.source == "hybrid"
    assert proposal.change.knob == "max_num_batched_tokens"
    assert isinstance(proposal.change.new, int) and proposal.change.new > 7168
    assert proposal.notes["direction"] == "up"
    assert proposal.notes["value_by"].startswith("TPE (ask ")
    assert proposal.notes["llm_tries"] == "1"
    assert proposal.hypothesis.startswith("Larger prefill chunks should cut the 8k cliff.")
    [request] = messages_api.requests
    body = request.body
    assert body is not None
    assert body["tool_choice"]["name"] == "choose_knob"
    assert (
        "Call the choose_knob tool exactly once, with one knob and the direction"
        in (body["system"])
    )
    schema = body["tools"][0]["input_schema"]
    assert schema["properties"]["knob"]["enum"] == SPACE.names
    assert schema["properties"]["direction"]["enum"] == ["up", "down", "any"]
    assert "value" not in schema["properties"]


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        (
            choice(knob="num_speculative_tokens", direction="up"),
            "knob num_speculative_tokens has no allowed value up from the champion's 7 "
            "(allowed now: 1, 2, 3, 4, 5, 6)",
        ),
        (
            choice(knob="cuda_graphs", direction="down"),
            "knob cuda_graphs has no allowed value down from the champion's false",
        ),
        (choice(knob="$(reboot)"), "unknown knob '$(reboot)'"),
        (choice(direction="sideways"), "direction 'sideways' is not one of up, down, any"),
        (choice(value=9000), "unexpected fields 'value'"),
        (choice(cuda_graphs=True), "exactly one knob per proposal"),
    ],
)
def test_a_refused_choice_goes_back_as_a_tool_error(
    messages_api: MessagesApi, bad: dict[str, Any], reason: str
) -> None:
    messages_api.script(
        tool_use(bad, name="choose_knob"),
        tool_use(choice(knob="num_speculative_tokens", direction="down"), name="choose_knob"),
    )
    proposal = hybrid(messages_api).propose(context())
    assert proposal.change.knob == "num_speculative_tokens"
    assert isinstance(proposal.change.new, int) and proposal.change.new < 7
    [error] = messages_api.requests[1].tool_errors()
    assert reason in error


def test_the_value_stays_out_of_known_bad_regions(messages_api: MessagesApi) -> None:
    barred = tuple(
        KnownBad(when={"num_speculative_tokens": k}, reason="wedges", source="crash")
        for k in (1, 2, 3, 4, 5)
    )
    messages_api.script(
        tool_use(choice(knob="num_speculative_tokens", direction="down"), name="choose_knob")
    )
    proposal = hybrid(messages_api).propose(context(barred))
    assert proposal.change.new == 6


@pytest.mark.parametrize(
    ("narrowed", "way", "values"),
    [
        # MNBT narrowed to 2048..4096: the champion's 7168 is above it, every value down
        ({"low": 2048, "high": 4096, "default": 4096}, "down", {2048, 2560, 3072, 3584, 4096}),
        # the KV dtype narrowed to auto: the champion's fp8_e4m3 has no place in the listing
        ({"choices": ["auto"], "default": "auto"}, "up", {"auto"}),
    ],
)
def test_a_champion_value_outside_a_narrowed_domain_is_moved_into_it(
    messages_api: MessagesApi, narrowed: dict[str, Any], way: str, values: set[object]
) -> None:
    """A profile narrowed the knob's domain under a champion that keeps its value (it was
    measured there). Claude's direction is read from that value (by number for an ordered
    knob; either way for one without an order), and the value TPE picks is in the domain.
    Before, the direction was looked up in the domain's listing, and a value outside it raised
    ValueError out of the proposer."""
    knob = "max_num_batched_tokens" if "low" in narrowed else "kv_cache_dtype"
    space = KnobSpace(
        knobs=tuple(
            k.model_copy(update=narrowed) if k.name == knob else k for k in catalog("vllm-dflash2")
        )
    )
    champion = Config({**CHAMPION, "max_num_batched_tokens": 7168, "kv_cache_dtype": "fp8_e4m3"})
    messages_api.script(tool_use(choice(knob=knob, direction=way), name="choose_knob"))
    proposal = hybrid(messages_api).propose(
        context().model_copy(update={"space": space, "champion": champion})
    )
    assert proposal.source == "hybrid"
    assert proposal.change.knob == knob and proposal.change.new in values


def test_without_a_usable_choice_optuna_proposes_alone(messages_api: MessagesApi) -> None:
    messages_api.script(overloaded())
    proposal = hybrid(messages_api).propose(context())
    assert proposal.source == "optuna (fallback from hybrid)"
    assert proposal.notes["llm_fallback"].startswith("Claude API unavailable (HTTP 529")


def _exl3_context() -> ProposalContext:
    """The proposal context with the noiseless EXL3 stack's champion cells (its per-position
    acceptance), what the draft-length model predicts K from."""
    exl3 = load_landscape("exl3-tp4").without_noise()
    cells = tuple(
        ChampionCell(
            cell=t.cell, output_throughput=t.output_tok_s, per_position_acceptance=t.per_position
        )
        for t in (exl3.truth(CHAMPION, c) for c in exl3.cells())
    )
    return context().model_copy(update={"champion_cells": cells})


def test_claude_picks_k_and_the_draft_length_model_the_value(messages_api: MessagesApi) -> None:
    """K down from 7 on the EXL3 stack: the value is the one the model predicts best (K=2),
    not TPE's draw; with the model off, TPE's."""
    with_cells = _exl3_context()
    k_down = choice(knob="num_speculative_tokens", direction="down")
    messages_api.script(tool_use(k_down, name="choose_knob"))
    proposal = hybrid(messages_api).propose(with_cells)
    assert (proposal.change.knob, proposal.change.new) == ("num_speculative_tokens", 2)
    assert proposal.notes["value_by"].startswith("the draft-length model (")
    assert "num_speculative_tokens=2 predicted +" in proposal.hypothesis
    messages_api.script(tool_use(k_down, name="choose_knob"))
    blind = HybridProposer(
        ClaudeOptions(api_retries=0),
        optuna=OptunaProposer(seed=0, n_startup=0, draft_model=False),
        base_url=messages_api.url,
    ).propose(with_cells)
    assert blind.notes["value_by"].startswith("TPE (ask ")


def test_a_K_value_the_model_picked_expects_the_models_number(messages_api: MessagesApi) -> None:
    """The draft-length model picked K=2: the expected effect is its prediction, as the Optuna
    proposer's K look says it (it was Claude's "objective higher by about 4%" beside the
    model's number in the hypothesis). Claude's expectation stays in the notes, and is said
    beside the model's where their directions differ, or where the sizes the same way are far
    apart (Claude +4 %, the model +18.3 %); a value TPE picked keeps Claude's."""
    with_cells = _exl3_context()
    model = predict(with_cells)
    assert model is not None and model.change_pct[2] > 0.5
    said = f"better than the champion: {model.describe(2)}; a model, not a measurement"
    k_down = choice(knob="num_speculative_tokens", direction="down", expected_size_pct=15)
    doubting = choice(knob="num_speculative_tokens", direction="down", expected_direction="lower")
    messages_api.script(
        tool_use(k_down, name="choose_knob"), tool_use(doubting, name="choose_knob")
    )
    agreed = hybrid(messages_api).propose(with_cells)
    assert agreed.change.new == 2 and agreed.expected_effect == said
    assert (agreed.notes["expected_direction"], agreed.notes["expected_size_pct"]) == (
        "higher",
        "15",
    )
    differed = hybrid(messages_api).propose(with_cells)
    assert differed.change.new == 2
    assert differed.expected_effect == f"{said}; Claude expected the objective lower by about 4%"
    assert differed.notes["expected_direction"] == "lower"

    # the same way, but Claude's +4 % is far from the model's +18.3 %: the record says both
    # (it read the model's number alone, as if Claude agreed with it)
    messages_api.script(
        tool_use(choice(knob="num_speculative_tokens", direction="down"), name="choose_knob")
    )
    modest = hybrid(messages_api).propose(with_cells)
    assert modest.change.new == 2
    assert modest.expected_effect == (
        f"{said}; Claude expected the objective higher too, by about 4% against the model's "
        f"{model.change_pct[2]:+.1f}%"
    ), modest.expected_effect

    messages_api.script(tool_use(choice(), name="choose_knob"))
    tpe = hybrid(messages_api).propose(with_cells)
    assert tpe.notes["value_by"].startswith("TPE (ask ")
    assert tpe.expected_effect == "objective higher by about 4%"
