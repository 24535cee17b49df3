"""``make_proposer``: the kinds it builds and the errors it raises."""

from __future__ import annotations

import pytest

from agents import KINDS, OptunaProposer, Proposer, SweepProposer, make_proposer
from knobs.errors import OrchestrateError, UsageError


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
    assert (default.n_startup, default.direction) == (4, "maximize")


def test_it_builds_a_sweep_proposer_with_or_without_a_list() -> None:
    listed = make_proposer("sweep", seed=0, options={"changes": [{"cuda_graphs": True}]})
    assert isinstance(listed, SweepProposer)
    assert listed.entries == [("cuda_graphs", True)]
    everything = make_proposer("sweep", seed=0, options={})
    assert isinstance(everything, SweepProposer)
    assert everything.entries is None


@pytest.mark.parametrize("kind", ["claude", "hybrid"])
def test_the_claude_proposers_are_not_built_yet(kind: str) -> None:
    with pytest.raises(UsageError) as caught:
        make_proposer(kind, seed=0, options={})
    assert str(caught.value) == f"the {kind} proposer arrives with issue #6; use optuna or sweep"
    assert caught.value.exit_code == 2


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
            {"direction": "up"},
            "optuna proposer options: direction: Input should be 'maximize' or 'minimize'",
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
def test_bad_options_are_usage_errors(kind: str, options: dict[str, object], message: str) -> None:
    with pytest.raises(UsageError) as caught:
        make_proposer(kind, seed=0, options=options)
    assert str(caught.value) == message
    assert isinstance(caught.value, OrchestrateError)
    assert caught.value.__cause__ is not None


def test_an_option_no_proposer_takes_is_a_usage_error() -> None:
    with pytest.raises(UsageError) as caught:
        make_proposer("optuna", seed=0, options={"trials": 5, "n_startup": 2})
    assert str(caught.value) == (
        "unknown proposer options: trials (accepted: changes, direction, n_startup)"
    )
