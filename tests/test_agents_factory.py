"""``make_proposer``: the kinds it builds and the errors it raises."""

from __future__ import annotations

import pytest

from agents import (
    KINDS,
    ClaudeProposer,
    HybridProposer,
    OptunaProposer,
    Proposer,
    SweepProposer,
    make_proposer,
)
from orchestrator.errors import OrchestrateError, UsageError


def test_it_builds_an_optuna_proposer_with_its_options() -> None:
    proposer = make_proposer("optuna", seed=11, options={"n_startup": 2, "direction": "minimize"})
    assert isinstance(proposer, OptunaProposer)
    assert isinstance(proposer, Proposer)
    assert (proposer.name, proposer.seed, proposer.n_startup, proposer.direction) == (
        "optuna",
        11,
        2,
        "minimize",
    )
    default = make_proposer("optuna", seed=0, options={})
    assert isinstance(default, OptunaProposer)
    assert (default.n_startup, default.direction, default.first_looks) == (4, "maximize", True)
    assert default.draft_model is True
    tpe_alone = make_proposer("optuna", seed=0, options={"first_looks": False})
    assert isinstance(tpe_alone, OptunaProposer) and tpe_alone.first_looks is False
    blind = make_proposer("optuna", seed=0, options={"draft_model": False})
    assert isinstance(blind, OptunaProposer) and blind.draft_model is False


def test_it_builds_a_sweep_proposer_with_or_without_a_list() -> None:
    listed = make_proposer("sweep", seed=0, options={"changes": [{"cuda_graphs": True}]})
    assert isinstance(listed, SweepProposer)
    assert listed.entries == [("cuda_graphs", True)]
    everything = make_proposer("sweep", seed=0, options={})
    assert isinstance(everything, SweepProposer)
    assert everything.entries is None


def test_it_builds_the_claude_proposers_with_optuna_behind_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-factory")
    claude = make_proposer(
        "claude", seed=3, options={"model": "claude-haiku-4-5", "max_tries": 2, "n_startup": 1}
    )
    assert isinstance(claude, ClaudeProposer) and isinstance(claude, Proposer)
    assert (claude.name, claude.options.model, claude.options.max_tries) == (
        "claude",
        "claude-haiku-4-5",
        2,
    )
    assert isinstance(claude.fallback, OptunaProposer)
    assert (claude.fallback.seed, claude.fallback.n_startup) == (3, 1)
    hybrid = make_proposer("hybrid", seed=0, options={"max_usd_per_round": 0.5})
    assert isinstance(hybrid, HybridProposer) and hybrid.options.max_usd_per_round == 0.5
    assert hybrid.optuna is hybrid.fallback
    claude.close()
    hybrid.close()


def test_an_unknown_kind_lists_the_known_ones() -> None:
    with pytest.raises(UsageError) as caught:
        make_proposer("gradient-descent", seed=0, options={})
    assert str(caught.value) == (
        "unknown proposer 'gradient-descent'; known: optuna, sweep, claude, hybrid"
    )
    assert KINDS == ("optuna", "sweep", "claude", "hybrid")


def test_options_of_another_kind_are_ignored() -> None:
    # a profile with a sweep list, run with --proposer optuna
    proposer = make_proposer("optuna", seed=0, options={"changes": [{"cuda_graphs": True}]})
    assert isinstance(proposer, OptunaProposer)
    sweep = make_proposer("sweep", seed=0, options={"n_startup": 2})
    assert isinstance(sweep, SweepProposer)


@pytest.mark.parametrize(
    ("kind", "options", "message"),
    [
        (
            "optuna",
            {"n_startup": -1},
            "optuna proposer options: n_startup: Input should be greater than or equal to 0",
        ),
        (
            "optuna",
            {"first_looks": "sometimes"},
            "optuna proposer options: first_looks: Input should be a valid boolean, unable to "
            "interpret input",
        ),
        (
            "optuna",
            {"direction": "up"},
            "optuna proposer options: direction: Input should be 'maximize' or 'minimize'",
        ),
        (
            "claude",
            {"max_tries": 0},
            "claude proposer options: max_tries: Input should be greater than or equal to 1",
        ),
        (
            "claude",
            {"model": "gpt-x"},
            "claude proposer options: options: no list price known for model "
            "'gpt-x': set input_usd_per_mtok and output_usd_per_mtok (known: claude-haiku-4-5, "
            "claude-opus-4-1, claude-opus-4-5, claude-opus-4-6, claude-sonnet-4-5, "
            "claude-sonnet-4-6)",
        ),
        (
            "sweep",
            {"changes": "all"},
            "sweep proposer options: changes: Input should be a valid list",
        ),
        (
            "sweep",
            {"changes": [{"cuda_graphs": True, "num_speculative_tokens": 5}]},
            "sweep proposer: sweep entry 1 must name exactly one knob, not "
            "{'cuda_graphs': True, 'num_speculative_tokens': 5}",
        ),
    ],
)
def test_bad_options_are_usage_errors(
    kind: str, options: dict[str, object], message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-factory")
    with pytest.raises(UsageError) as caught:
        make_proposer(kind, seed=0, options=options)
    assert str(caught.value) == message
    assert isinstance(caught.value, OrchestrateError)
    assert caught.value.__cause__ is not None


def test_an_option_no_proposer_takes_is_a_usage_error() -> None:
    with pytest.raises(UsageError) as caught:
        make_proposer("optuna", seed=0, options={"trials": 5, "n_startup": 2})
    assert str(caught.value) == (
        "unknown proposer options: trials (accepted: api_deadline_s, api_retries, api_timeout_s, "
        "brief, changes, direction, draft_model, first_looks, input_usd_per_mtok, max_tokens, "
        "max_tries, max_usd_per_round, model, n_startup, output_usd_per_mtok, strict_tools)"
    )
