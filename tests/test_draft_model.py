"""The draft-length model: K's effect predicted from the champion's per-position acceptance,
its step cost the verdict's fit of the K changes measured, and the Optuna proposer's K looks
in its order. Contexts are built from the twin's noise-free truth; the round test runs the
real loop on the simulated cluster."""

from __future__ import annotations

import io
import math
from pathlib import Path

import pytest
from rich.console import Console

from agents import ChampionCell, HistoryEntry, OptunaProposer, ProposalContext, digest
from agents.draft_model import GAMMA_PRIOR, accepted, draft_knob, predict
from agents.optuna_proposer import DRAFT_LOOK_FLOOR, first_look
from cluster.simulated import SimulatedTestbed
from cluster.twin.landscape import Landscape, load_landscape
from knobs.config import Config
from knobs.spec import KnobSpec, Value
from ledger import Ledger
from orchestrator.approval import ApprovalGate
from orchestrator.display import RoundDisplay
from orchestrator.profile import Profile
from orchestrator.round import RoundOptions, RoundRunner
from orchestrator.step_cost import DraftChange, fit, learned
from orchestrator.testbed import NullSink

CARD_000 = (0.750, 0.555, 0.415, 0.316, 0.244, 0.193, 0.153)  # DOMAIN: ≈ 3.63 at K=7


@pytest.fixture(scope="module")
def exl3() -> Landscape:
    return load_landscape("exl3-tp4").without_noise()


def truth_context(
    landscape: Landscape,
    overrides: dict[str, Value] | None = None,
    measured: dict[int, float] | None = None,
) -> ProposalContext:
    """A context whose champion (the landscape's defaults with ``overrides``) was measured
    without noise, with ``measured`` K values (under it) at their true ratio."""
    space = landscape.knob_space()
    champion = Config({s.name: s.default for s in space.knobs} | (overrides or {}))
    cells = [landscape.truth(champion, c) for c in landscape.cells()]
    base = sum(t.output_tok_s for t in cells)
    history = [
        HistoryEntry(
            experiment=1,
            config=dict(champion),
            knob=None,
            value=None,
            status="keep",
            objective=base,
            delta_pct=0.0,
            champion_key=champion.key,
        )
    ]
    for i, (k, value) in enumerate(sorted((measured or {}).items()), start=2):
        config = dict(champion) | {"num_speculative_tokens": k}
        true = landscape.objective(config)
        assert true is not None
        history.append(
            HistoryEntry(
                experiment=i,
                config=config,
                knob="num_speculative_tokens",
                value=k,
                status="discard",
                objective=value * base,
                delta_pct=(value - 1.0) * 100.0,
                champion_key=champion.key,
            )
        )
    return ProposalContext(
        space=space,
        champion=champion,
        champion_objective=base,
        history=tuple(history),
        known_bad=(),
        decided_keys=frozenset({champion.key}),
        budget_left=10,
        seed=0,
        champion_cells=tuple(
            ChampionCell(
                cell=t.cell,
                output_throughput=t.output_tok_s,
                per_position_acceptance=t.per_position,
            )
            for t in cells
        ),
    )


def true_change(landscape: Landscape, context: ProposalContext, k: int) -> float:
    champion = landscape.objective(context.champion)
    candidate = landscape.objective(dict(context.champion) | {"num_speculative_tokens": k})
    assert champion is not None and candidate is not None
    return (candidate / champion - 1.0) * 100.0


def test_accepted_tokens_per_step_is_one_plus_the_accepted_positions() -> None:
    assert accepted(CARD_000, 7) == pytest.approx(3.626)
    assert accepted(CARD_000, 2) == pytest.approx(2.305)
    assert accepted(CARD_000, 0) == 1.0
    # beyond the positions measured, each further one falls as the last two did
    fall = 0.153 / 0.193
    assert accepted(CARD_000, 9) == pytest.approx(3.626 + 0.153 * fall + 0.153 * fall**2)
    # one position measured: an i.i.d. draft, each position at a_0 of the one before
    assert accepted((0.5,), 3) == pytest.approx(1.0 + 0.5 + 0.25 + 0.125)


def test_a_drafter_that_accepts_nothing_wants_the_shortest_draft_and_a_perfect_one_the_longest(
    exl3: Landscape,
) -> None:
    context = truth_context(exl3)
    for rates, best in (((0.0,) * 7, 1), ((1.0,) * 7, 7)):
        cells = tuple(
            c.model_copy(update={"per_position_acceptance": rates}) for c in context.champion_cells
        )
        model = predict(context.model_copy(update={"champion_cells": cells}))
        assert model is not None
        assert model.best() == best
        assert model.gamma == GAMMA_PRIOR and model.fitted_on == 0
    # with nothing accepted every shorter draft only saves step time: all gains
    none = context.model_copy(
        update={
            "champion_cells": tuple(
                c.model_copy(update={"per_position_acceptance": (0.0,) * 7})
                for c in context.champion_cells
            )
        }
    )
    model = predict(none)
    assert model is not None
    assert all(model.change_pct[k] > model.change_pct[k + 1] > 0 for k in range(1, 6))


def test_the_prior_ranks_the_true_best_K_first_on_the_exl3_stack(exl3: Landscape) -> None:
    context = truth_context(exl3)
    model = predict(context)
    assert model is not None and model.current == 7
    assert model.best() == 2
    assert max(range(1, 7), key=lambda k: true_change(exl3, context, k)) == 2


def test_the_step_cost_is_the_verdicts_fit_of_the_K_changes_measured(exl3: Landscape) -> None:
    """The proposer prices a draft token with the verdict's posterior of ``γ``
    (``orchestrator.step_cost``, handed over in the context): one K change measured with its
    counters (K=2, the prior's best, one boot a side) moves every prediction nearer the truth;
    the history's K readings alone move nothing (the fit is the verdict's, not the model's)."""
    blank = truth_context(exl3)
    cells = blank.champion_cells
    base = sum(c.output_throughput for c in cells)
    # what the counters of K=2 say (the tokens a step accepts), and what it measured beyond them
    tokens = sum(
        c.output_throughput
        * accepted(c.per_position_acceptance, 2)
        / accepted(c.per_position_acceptance, 7)
        for c in cells
    )
    shift = math.log(tokens / base)
    residual = math.log(1.0 + true_change(exl3, blank, 2) / 100.0) - shift
    belief = fit([DraftChange(7, 2, residual, 0.07)]).belief()
    model = predict(blank.model_copy(update={"step_cost": belief}))
    prior = predict(blank)
    assert model is not None and prior is not None
    assert model.fitted_on == 1 and model.gamma > GAMMA_PRIOR + 0.01 and model.gamma_sd > 0
    assert prior.fitted_on == 0 and prior.gamma == GAMMA_PRIOR
    assert model.best() == 2
    for k in (1, 3, 4):
        error = abs(model.change_pct[k] - true_change(exl3, blank, k))
        assert error < abs(prior.change_pct[k] - true_change(exl3, blank, k))
        assert error < 3.0, (k, model.change_pct[k])
    assert "from 1 K change(s) measured with their counters" in model.describe(3)
    # K readings in the history without the verdict's fit: the prior's prediction
    measured = truth_context(exl3, measured={2: 1.0 + true_change(exl3, blank, 2) / 100.0})
    assert predict(measured) == prior


def test_no_prediction_without_a_draft_knob_or_per_position_counters(exl3: Landscape) -> None:
    context = truth_context(exl3)
    assert draft_knob(context.space) is not None
    bare = tuple(
        c.model_copy(update={"per_position_acceptance": ()}) for c in context.champion_cells
    )
    assert predict(context.model_copy(update={"champion_cells": bare})) is None
    assert predict(context.model_copy(update={"champion_cells": ()})) is None


def test_a_draft_role_needs_a_count_of_tokens() -> None:
    def spec(**fields: object) -> KnobSpec:
        return KnobSpec.model_validate(
            {"name": "k", "render": {"kind": "flag", "flag": "--k"}, "role": "draft_tokens"}
            | fields
        )

    assert spec(type="choice", choices=[7], default=7).role == "draft_tokens"
    assert spec(type="int", low=0, high=8, default=2).role == "draft_tokens"
    for bad in (
        {"type": "choice", "choices": ["short", "long"], "default": "short"},
        {"type": "float", "low": 0.5, "high": 4, "step": 0.5, "default": 1},
        {"type": "int", "low": -1, "high": 4, "default": 2},
    ):
        with pytest.raises(ValueError, match="role draft_tokens needs a count of draft tokens"):
            spec(**bad)


def test_one_value_is_nothing_to_predict(exl3: Landscape) -> None:
    context = truth_context(exl3)
    fixed = context.space.spec("num_speculative_tokens").model_copy(
        update={"type": "choice", "choices": (7,), "low": None, "high": None}
    )
    space = context.space.model_copy(
        update={"knobs": tuple(fixed if k.name == fixed.name else k for k in context.space.knobs)}
    )
    assert predict(context.model_copy(update={"space": space})) is None


def test_the_proposer_looks_at_the_predicted_best_K_first(exl3: Landscape) -> None:
    # CUDA graphs already on: K is the one first look left
    context = truth_context(exl3, {"cuda_graphs": True})
    graphs_off = Config(dict(context.champion) | {"cuda_graphs": False})
    context = context.model_copy(update={"decided_keys": context.decided_keys | {graphs_off.key}})
    proposal = OptunaProposer(seed=3).propose(context)
    assert (proposal.change.knob, proposal.change.new) == ("num_speculative_tokens", 2)
    assert proposal.notes["sampler"] == "draft model"
    assert "num_speculative_tokens=2 predicted +" in proposal.hypothesis
    # without the model the value is TPE's: over seeds it is not always the best one
    drawn = {
        OptunaProposer(seed=s, draft_model=False).propose(context).change.new for s in range(8)
    }
    assert len(drawn) > 1


def test_a_K_predicted_far_worse_than_the_champion_gets_no_first_look() -> None:
    vllm = load_landscape("vllm-dflash2-tp4").without_noise()
    context = truth_context(vllm)  # K=7 is best there
    model = predict(context)
    assert model is not None
    # every knob gets a look under the first champion: take the other knobs' looks away
    others = {
        context.champion.apply(c).key
        for c in context.candidates()
        if c.knob != "num_speculative_tokens"
    }
    context = context.model_copy(update={"decided_keys": context.decided_keys | others})
    first = first_look(context, context.candidates(), 0, model)
    assert first is not None
    knob, looks = first
    assert knob == "num_speculative_tokens"
    looked = {int(c.new) for c in looks}
    far = {k for k, pct in model.change_pct.items() if pct < -DRAFT_LOOK_FLOOR}
    assert far and looked and not looked & far
    assert looked | far == set(range(1, 7))
    for k in far:
        assert true_change(vllm, context, k) < -DRAFT_LOOK_FLOOR


def test_the_round_gives_the_proposer_the_champions_cells(tmp_path: Path, exl3: Landscape) -> None:
    profile = Profile.model_validate(
        {
            "name": "sim",
            "model": "sim",
            "cluster": {
                "name": "sim",
                "nodes": [{"rank": 0, "host": "127.0.0.1", "workdir": "/nonexistent"}],
            },
            "launcher": {"argv": ["true"]},
            "knob_catalog": exl3.catalog,
            "cells": [c.model_dump() for c in exl3.cells()],
        }
    )
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        runner = RoundRunner(
            profile,
            ledger,
            NullSink(),
            SimulatedTestbed(exl3, seed=1),
            OptunaProposer(seed=1),
            ApprovalGate(ledger, "auto"),
            RoundDisplay(Console(file=io.StringIO())),
        )
        runner.run(RoundOptions(budget=2, proposer="optuna", approve="auto", seed=1))
        context = runner.context(ledger.rounds("sim")[-1])
        proposals = ledger.proposals()
        step = learned(ledger, profile.space, ledger.experiments(cluster="sim"))
    by_name = {c.cell: c for c in context.champion_cells}
    assert set(by_name) == {c.name for c in exl3.cells()}
    for cell in exl3.cells():
        truth = exl3.truth(context.champion, cell)
        assert by_name[cell.name].per_position_acceptance == pytest.approx(
            truth.per_position, abs=0.02
        )
    # a K look was proposed from the model (graphs or K come first; both get looks)
    k_looks = [p for p in proposals if p.knob == "num_speculative_tokens"]
    assert k_looks and all(p.notes.get("sampler") == "draft model" for p in k_looks)
    # the K change measured with its counters reaches the proposer as the verdict's fit of γ
    assert step is not None and context.step_cost == step.belief()
    model = predict(context)
    assert model is not None and model.fitted_on == step.changes >= 1


def test_the_digest_shows_the_prediction_as_a_model_not_a_measurement(exl3: Landscape) -> None:
    context = truth_context(exl3)
    text = digest(context)
    assert "## Draft length predicted from the champion's per-position acceptance" in text
    assert "a model, not a measurement" in text
    assert "num_speculative_tokens=2 predicted +" in text
    assert "Draft length" not in digest(context.model_copy(update={"champion_cells": ()}))


def test_a_K_look_expects_what_its_hypothesis_predicts(exl3: Landscape) -> None:
    """The draft-length model chose the value and says what it predicts: the proposal's
    expected effect is that prediction (``proposals list --json``, the ``ask`` prompt, MLflow),
    not "unknown" beside a hypothesis that names a number; better or worse as the number is."""
    context = truth_context(exl3, {"cuda_graphs": True})
    graphs_off = Config(dict(context.champion) | {"cuda_graphs": False})
    context = context.model_copy(update={"decided_keys": context.decided_keys | {graphs_off.key}})
    vllm = load_landscape("vllm-dflash2-tp4").without_noise()
    worse = truth_context(vllm)  # K=7 is best there: every K look is predicted worse
    others = {
        worse.champion.apply(c).key
        for c in worse.candidates()
        if c.knob != "num_speculative_tokens"
    }
    worse = worse.model_copy(update={"decided_keys": worse.decided_keys | others})
    for ctx, word in ((context, "better"), (worse, "worse")):
        model = predict(ctx)
        assert model is not None
        proposal = OptunaProposer(seed=3).propose(ctx)
        assert proposal.notes["sampler"] == "draft model"
        value = int(proposal.change.new)
        assert (model.change_pct[value] > 0) == (word == "better")
        said = model.describe(value)
        assert said in proposal.hypothesis
        assert proposal.expected_effect == (
            f"{word} than the champion: {said}; a model, not a measurement"
        )
