"""Coupled moves (issue #18, item 4): a value that failed to boot for a reason another knob
explains is tried together with that knob's enabling change, as one experiment, marked as
coupled in the ledger, results.tsv, MLflow and the veto prompt; nothing else changes two knobs.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient
from pydantic import ValidationError
from rich.console import Console

from agents import (
    ClaudeOptions,
    ClaudeProposer,
    HistoryEntry,
    HybridProposer,
    KnownBad,
    OptunaProposer,
    ProposalContext,
    digest,
)
from agents.coupled import COUPLED_NOTE, open_moves
from agents.sweep import SweepProposer
from bench.ceilings import ceiling, widest_path
from cluster.simulated import SimulatedTestbed
from cluster.twin.landscape import landscape_path, load_landscape
from knobs import KnobSpace, catalog
from knobs.config import Change, Config
from knobs.errors import KnobError
from knobs.vocabulary import Kind, Status
from ledger import Ledger, tsv_text
from ledger.mlflow_sink import MlflowSink
from orchestrator.approval import Answer, ApprovalGate
from orchestrator.cli.round import _ask as ask_at_prompt
from orchestrator.display import RoundDisplay
from orchestrator.history import crash_region
from orchestrator.known_bad import barred_regions
from orchestrator.profile import Profile
from orchestrator.round import RoundOptions, RoundRunner
from orchestrator.testbed import NullSink
from tests.fixtures.messages_api import MessagesApi
from tests.fixtures.mlflow_store import MlflowStore

SPACE = KnobSpace(knobs=catalog("vllm-dflash2"))
CHAMPION = SPACE.default_config()  # kv_cache_dtype fp8_e4m3, gpu_memory_utilization 0.85
KV_AUTO = CHAMPION.apply(SPACE.change(CHAMPION, "kv_cache_dtype", "auto"))


def crashed(
    experiment: int,
    config: Config,
    knob: str,
    value: object,
    failure: str,
    *,
    champion: Config = CHAMPION,
    coupled: tuple[str, object] | None = None,
) -> HistoryEntry:
    return HistoryEntry(
        experiment=experiment,
        config=config.as_dict(),
        knob=knob,
        value=value,
        coupled_knob=None if coupled is None else coupled[0],
        coupled_value=None if coupled is None else coupled[1],
        status=Status.CRASH,
        objective=None,
        delta_pct=None,
        champion_key=champion.key,
        failure_class=failure,
    )


def kv_short(at: float) -> KnownBad:
    """What ``kv_cache_dtype=auto`` short of KV memory at a fraction ``at`` bars."""
    return KnownBad(
        when={"kv_cache_dtype": "auto"},
        at_most={"gpu_memory_utilization": at},
        reason="kv_capacity",
        source="crash",
    )


def context(
    history: tuple[HistoryEntry, ...],
    known_bad: tuple[KnownBad, ...],
    *,
    champion: Config = CHAMPION,
    decided: frozenset[str] = frozenset(),
) -> ProposalContext:
    return ProposalContext(
        space=SPACE,
        champion=champion,
        champion_objective=100.0,
        history=history,
        known_bad=known_bad,
        decided_keys=decided,
        budget_left=5,
        seed=0,
    )


# ---- the change -------------------------------------------------------------------------------
def test_a_coupled_change_names_both_knobs_and_moves_both() -> None:
    change = SPACE.coupled_change(
        CHAMPION, "kv_cache_dtype", "auto", "gpu_memory_utilization", "0.86"
    )
    assert change.coupled and change.label == "kv_cache_dtype+gpu_memory_utilization"
    assert change.describe() == (
        "kv_cache_dtype fp8_e4m3 → auto + gpu_memory_utilization 0.85 → 0.86"
    )
    moved = CHAMPION.apply(change)
    assert CHAMPION.diff(moved) == ["gpu_memory_utilization", "kv_cache_dtype"]
    assert [m.knob for m in change.moves()] == ["kv_cache_dtype", "gpu_memory_utilization"]
    one = SPACE.change(CHAMPION, "kv_cache_dtype", "auto")
    assert not one.coupled and one.label == "kv_cache_dtype" and one.moves() == (one,)
    with pytest.raises(KnobError, match="two knobs"):
        SPACE.coupled_change(CHAMPION, "kv_cache_dtype", "auto", "kv_cache_dtype", "fp8_e5m2")
    with pytest.raises(ValidationError, match="not more"):
        Change(knob="a", old=1, new=2, enabling=change)


# ---- when a coupled move is open ----------------------------------------------------------------
def test_a_value_short_of_kv_memory_opens_the_move_with_the_next_memory_fraction() -> None:
    ctx = context(
        (crashed(2, KV_AUTO, "kv_cache_dtype", "auto", "kv_capacity"),), (kv_short(0.85),)
    )
    [move] = ctx.coupled_moves()
    assert move.change.describe() == (
        "kv_cache_dtype fp8_e4m3 → auto + gpu_memory_utilization 0.85 → 0.86"
    )
    assert move.experiment == 2 and move.failure_class == "kv_capacity"
    assert "kv_capacity" in move.why() and "#2" in move.why()
    assert ctx.refusal(move.change) is None
    # the one-knob change stays barred, and a one-knob proposer's candidates never pair knobs
    assert ctx.refusal(SPACE.change(CHAMPION, "kv_cache_dtype", "auto")) is not None
    assert all(not c.coupled for c in ctx.candidates())
    proposal = OptunaProposer(seed=0).propose(ctx)
    assert proposal.change == move.change
    assert proposal.notes["sampler"] == "coupled" and proposal.notes[COUPLED_NOTE] == move.why()
    assert "a coupled move" in proposal.hypothesis


def test_nothing_else_changes_two_knobs() -> None:
    ctx = context(
        (crashed(2, KV_AUTO, "kv_cache_dtype", "auto", "kv_capacity"),), (kv_short(0.85),)
    )
    further = SPACE.coupled_change(
        CHAMPION, "kv_cache_dtype", "auto", "gpu_memory_utilization", 0.88
    )
    other = SPACE.coupled_change(CHAMPION, "cuda_graphs", True, "num_speculative_tokens", 5)
    for change in (further, other):
        refused = ctx.refusal(change)
        assert refused is not None and "not an open coupled move" in refused.reason
    # no failure, no coupled move
    assert context((), ()).coupled_moves() == []


@pytest.mark.parametrize(
    ("entry", "regions", "why"),
    [
        # a wedge: no knob declares it, so no other knob explains it
        (
            crashed(2, KV_AUTO, "kv_cache_dtype", "auto", "boot_wedge"),
            (KnownBad(when={"kv_cache_dtype": "auto"}, reason="boot_wedge", source="crash"),),
            "undeclared failure",
        ),
        # the memory knob's own failure: no other knob declares kv_capacity
        (
            crashed(
                2,
                CHAMPION.apply(SPACE.change(CHAMPION, "gpu_memory_utilization", 0.7)),
                "gpu_memory_utilization",
                0.7,
                "kv_capacity",
            ),
            (KnownBad(at_most={"gpu_memory_utilization": 0.7}, reason="", source="crash"),),
            "its own knob",
        ),
        # a region a person cleared (or none at all): the value may run alone
        (crashed(2, KV_AUTO, "kv_cache_dtype", "auto", "kv_capacity"), (), "not barred"),
        # the next fraction is itself barred (out of memory from 0.86 up)
        (
            crashed(2, KV_AUTO, "kv_cache_dtype", "auto", "kv_capacity"),
            (
                kv_short(0.85),
                KnownBad(at_least={"gpu_memory_utilization": 0.86}, reason="oom", source="crash"),
            ),
            "enabling value barred",
        ),
    ],
)
def test_no_coupled_move_without_a_cause_another_knob_cures(
    entry: HistoryEntry, regions: tuple[KnownBad, ...], why: str
) -> None:
    assert context((entry,), regions).coupled_moves() == [], why


def test_the_enabling_knob_steps_past_the_barred_region() -> None:
    """A champion at 0.80 whose kv=auto failed at 0.83 (under an earlier champion): the move
    goes to the first fraction outside the region, 0.84, not to 0.81."""
    low = SPACE.config({**CHAMPION.as_dict(), "gpu_memory_utilization": 0.8})
    failed_at = SPACE.config({**KV_AUTO.as_dict(), "gpu_memory_utilization": 0.83})
    entry = crashed(2, failed_at, "kv_cache_dtype", "auto", "kv_capacity")
    [move] = context((entry,), (kv_short(0.83),), champion=low).coupled_moves()
    assert move.change.enabling is not None
    assert move.change.enabling.old == 0.8 and move.change.enabling.new == 0.84


def test_one_coupled_try_per_value_and_failure_under_a_champion() -> None:
    """The pair failed too: it bars the pair's region, and no second coupled try follows
    under this champion (a later champion may try again)."""
    pair = KV_AUTO.apply(SPACE.change(KV_AUTO, "gpu_memory_utilization", 0.86))
    entries = (
        crashed(2, KV_AUTO, "kv_cache_dtype", "auto", "kv_capacity"),
        crashed(
            3,
            pair,
            "kv_cache_dtype",
            "auto",
            "kv_capacity",
            coupled=("gpu_memory_utilization", 0.86),
        ),
    )
    regions = (kv_short(0.85), kv_short(0.86))
    assert context(entries, regions).coupled_moves() == []
    later = SPACE.config({**CHAMPION.as_dict(), "cuda_graphs": True})
    [move] = open_moves(context(entries, regions, champion=later))
    assert move.change.enabling is not None and move.change.enabling.new == 0.87


def test_a_failed_coupled_move_bars_the_pair_not_its_first_knob_alone(tmp_path: Path) -> None:
    prof = _profile(tmp_path, "sm121-2node")
    pair = KV_AUTO.apply(SPACE.change(KV_AUTO, "gpu_memory_utilization", 0.86))
    short = crash_region(
        prof, "kv_cache_dtype", "auto", pair, "kv_capacity", ("gpu_memory_utilization", 0.86)
    )
    assert short.region() == "kv_cache_dtype=auto, gpu_memory_utilization<=0.86"
    oom = crash_region(
        prof, "kv_cache_dtype", "auto", pair, "oom", ("gpu_memory_utilization", 0.86)
    )
    assert oom.region() == "kv_cache_dtype=auto, gpu_memory_utilization>=0.86"
    wedge = crash_region(
        prof, "kv_cache_dtype", "auto", pair, "boot_wedge", ("gpu_memory_utilization", 0.86)
    )
    assert wedge.region() == "kv_cache_dtype=auto, gpu_memory_utilization=0.86"


def test_the_veto_prompt_refuses_to_edit_a_coupled_move(tmp_path: Path) -> None:
    ctx = context(
        (crashed(2, KV_AUTO, "kv_cache_dtype", "auto", "kv_capacity"),), (kv_short(0.85),)
    )
    [move] = ctx.coupled_moves()
    answers = iter([Answer("edit", value="fp8_e5m2"), Answer("approve")])
    problems: list[str | None] = []

    def ask(p: object, problem: str | None) -> Answer:
        problems.append(problem)
        return next(answers)

    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        rnd = ledger.create_round(
            cluster="c",
            profile_name="p",
            profile_digest="d",
            budget=1,
            proposer="optuna",
            approve="ask",
            seed=0,
        )
        assert move.change.enabling is not None
        record = ledger.add_proposal(
            round_id=rnd.id,
            source="optuna",
            knob=move.change.knob,
            old_value=move.change.old,
            new_value=move.change.new,
            champion_key=CHAMPION.key,
            coupled=(move.change.enabling.knob, 0.85, 0.86),
        )
        assert record.change == move.change
        decided = ApprovalGate(ledger, "ask", asker=ask).decide(record, ctx)
    assert decided.status == "approved" and decided.new_value == "auto"
    assert problems[0] is None and "approved or vetoed as proposed" in (problems[1] or "")


# ---- a round on the simulated cluster ------------------------------------------------------------
def _profile(tmp: Path, landscape: str | Path) -> Profile:
    land = load_landscape(landscape)
    return Profile.model_validate(
        {
            "name": "sim-coupled",
            "model": "sim",
            "cluster": {
                "name": "sim-coupled",
                "nodes": [{"rank": 0, "host": "127.0.0.1", "workdir": str(tmp)}],
            },
            "launcher": {"argv": ["true"]},
            "knob_catalog": land.catalog,
            "cells": [c.model_dump() for c in land.cells()],
            "proposer": {"kind": "optuna", "seed": 0},
        }
    )


def _round(
    ledger: Ledger, prof: Profile, testbed: SimulatedTestbed, proposer: object, budget: int
) -> None:
    RoundRunner(
        prof,
        ledger,
        MlflowSink(),
        testbed,
        proposer,  # type: ignore[arg-type]
        ApprovalGate(ledger, "auto"),
        RoundDisplay(Console(file=io.StringIO())),
    ).run(RoundOptions(budget=budget, proposer="optuna", approve="auto", seed=0))


def test_a_round_on_the_two_node_stack_measures_the_coupled_move(
    tmp_path: Path, mlflow_db: MlflowStore
) -> None:
    """sm121-2node: the unquantised KV cache needs a memory fraction of 0.86 and the champion
    holds 0.85. kv_cache_dtype=auto crashes with kv_capacity; the Optuna proposer's next move
    is auto with 0.86, one experiment, measured and judged against the champion, and the
    ledger, results.tsv and MLflow all name both knobs."""
    prof = _profile(tmp_path, "sm121-2node")
    testbed = SimulatedTestbed(load_landscape("sm121-2node"), seed=0)
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        _round(ledger, prof, testbed, SweepProposer([{"kv_cache_dtype": "auto"}]), 1)
        _round(ledger, prof, testbed, OptunaProposer(seed=0), 1)
        experiments = [e for e in ledger.experiments() if e.kind == Kind.CANDIDATE]
        proposals = {p.id: p for p in ledger.proposals()}
        tsv = tsv_text(ledger.experiments())
        regions = barred_regions(prof, ledger)
    alone, pair = experiments
    assert alone.status == Status.CRASH and alone.failure_class == "kv_capacity"
    assert pair.knob == "kv_cache_dtype" and pair.value == "auto"
    assert pair.coupled_knob == "gpu_memory_utilization" and pair.coupled_value == 0.86
    assert pair.label == "kv_cache_dtype+gpu_memory_utilization"
    # it booted (0.86 holds the BF16 KV cache) and was measured and judged as usual
    assert pair.status in (Status.KEEP, Status.DISCARD, Status.INCONCLUSIVE), pair
    assert pair.objective is not None and pair.objective > 0
    assert pair.proposal_id is not None
    proposal = proposals[pair.proposal_id]
    assert proposal.notes["sampler"] == "coupled" and proposal.coupled_old == 0.85
    assert f"experiment #{alone.id}" in proposal.notes[COUPLED_NOTE]
    row = tsv.splitlines()[-1].split("\t")
    assert row[0] == str(pair.id)
    assert row[5:7] == ["kv_cache_dtype+gpu_memory_utilization", "auto+0.86"]
    assert "kv_cache_dtype fp8_e4m3 → auto + gpu_memory_utilization 0.85 → 0.86" in row[7]
    # only the one-knob crash bars anything
    assert [r.region.region() for r in regions] == [
        "kv_cache_dtype=auto, gpu_memory_utilization<=0.85"
    ]
    client = MlflowClient(tracking_uri=mlflow_db.tracking_uri)
    assert pair.mlflow_run_id is not None
    run = client.get_run(pair.mlflow_run_id)
    assert run.info.run_name == (
        f"exp-{pair.id} · kv_cache_dtype fp8_e4m3→auto + gpu_memory_utilization 0.85→0.86 "
        f"· {pair.status}"
    )
    assert run.data.params["coupled"] == "kv_cache_dtype+gpu_memory_utilization"
    assert run.data.params["kv_cache_dtype"] == "auto"
    assert run.data.params["gpu_memory_utilization"] == "0.86"
    assert run.data.tags["knob"] == "kv_cache_dtype+gpu_memory_utilization"
    assert "kv_capacity" in run.data.tags["coupled_because"]


def test_a_coupled_move_that_fails_again_bars_the_pair(
    tmp_path: Path, mlflow_db: MlflowStore
) -> None:
    """A test landscape whose BF16 KV cache needs 0.87: the pair at 0.86 fails with
    kv_capacity too, a crash at once (the memory knob declares it monotone), barring
    kv_cache_dtype=auto up to 0.86 only; and no second coupled try follows."""
    data = yaml.safe_load(landscape_path("sm121-2node").read_text())
    data["boot"]["kv_min_utilization"]["auto"] = 0.87
    data["name"] = "sm121-kv-hungry"
    path = tmp_path / "kv-hungry.yaml"
    path.write_text(yaml.safe_dump(data))
    prof = _profile(tmp_path, path)
    testbed = SimulatedTestbed(load_landscape(path), seed=0)
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        _round(ledger, prof, testbed, SweepProposer([{"kv_cache_dtype": "auto"}]), 1)
        _round(ledger, prof, testbed, OptunaProposer(seed=0), 2)
        experiments = [e for e in ledger.experiments() if e.kind == Kind.CANDIDATE]
        regions = [r.region.region() for r in barred_regions(prof, ledger)]
        boots = {e.id: len(ledger.boots(e.id)) for e in experiments}
    alone, pair, after = experiments
    assert alone.status == Status.CRASH and alone.coupled_knob is None
    assert pair.coupled_knob == "gpu_memory_utilization" and pair.coupled_value == 0.86
    assert pair.status == Status.CRASH and pair.failure_class == "kv_capacity"
    assert boots[pair.id] == 1  # monotone in the enabling knob: no second boot
    assert regions == [
        "kv_cache_dtype=auto, gpu_memory_utilization<=0.85",
        "kv_cache_dtype=auto, gpu_memory_utilization<=0.86",
    ]
    assert after.coupled_knob is None, after  # one coupled try per value under a champion


def test_the_veto_prompt_says_the_move_is_coupled_and_which_failure_it_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ctx = context(
        (crashed(2, KV_AUTO, "kv_cache_dtype", "auto", "kv_capacity"),), (kv_short(0.85),)
    )
    [move] = ctx.coupled_moves()
    proposal = OptunaProposer(seed=0).propose(ctx)
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        rnd = ledger.create_round(
            cluster="c", profile_name="p", profile_digest="d", budget=1, proposer="optuna",
            approve="ask", seed=0,
        )  # fmt: skip
        assert proposal.change.enabling is not None
        record = ledger.add_proposal(
            round_id=rnd.id,
            source=proposal.source,
            knob=proposal.change.knob,
            old_value=proposal.change.old,
            new_value=proposal.change.new,
            champion_key=CHAMPION.key,
            hypothesis=proposal.hypothesis,
            notes=dict(proposal.notes),
            coupled=(proposal.change.enabling.knob, 0.85, 0.86),
        )
    out = io.StringIO()
    monkeypatch.setattr("sys.stdin", io.StringIO("veto\nnot tonight\n"))
    answer = ask_at_prompt(Console(file=out, width=400), record, None)
    shown = out.getvalue()
    assert "kv_cache_dtype fp8_e4m3 → auto + gpu_memory_utilization 0.85 → 0.86" in shown
    coupled_line = next(line for line in shown.splitlines() if "coupled:" in line)
    assert move.why() in coupled_line
    assert answer == Answer("veto", reason="not tonight")


def test_a_kept_coupled_move_moves_both_knobs_in_the_champion(
    tmp_path: Path, mlflow_db: MlflowStore
) -> None:
    """A test landscape where the FP8 KV cache costs 30 % a step: the BF16 cache at 0.86 is a
    large gain, kept, and the champion holds both of the move's values."""
    data = yaml.safe_load(landscape_path("sm121-2node").read_text())
    data["decode"]["kv_cache_dtype"]["fp8_e4m3"]["step"] = 1.3
    data["name"] = "sm121-slow-fp8"
    path = tmp_path / "slow-fp8.yaml"
    path.write_text(yaml.safe_dump(data))
    prof = _profile(tmp_path, path)
    testbed = SimulatedTestbed(load_landscape(path), seed=0)
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        _round(ledger, prof, testbed, SweepProposer([{"kv_cache_dtype": "auto"}]), 1)
        _round(ledger, prof, testbed, OptunaProposer(seed=0), 1)
        pair = [e for e in ledger.experiments() if e.kind == Kind.CANDIDATE][-1]
        champion = ledger.champion(prof.cluster.name)
    assert pair.coupled_knob == "gpu_memory_utilization"
    assert pair.status == Status.KEEP, pair
    assert champion is not None and champion.experiment_id == pair.id
    assert champion.config["kv_cache_dtype"] == "auto"
    assert champion.config["gpu_memory_utilization"] == 0.86


def test_a_coupled_proposal_left_pending_by_a_kill_runs_on_resume(tmp_path: Path) -> None:
    """The round recorded the coupled proposal and was killed before its gate: the resumed
    round reads both knobs back from the ledger and runs the pair, not the first knob alone."""
    prof = _profile(tmp_path, "sm121-2node")
    testbed = SimulatedTestbed(load_landscape("sm121-2node"), seed=0)
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        _round(ledger, prof, testbed, SweepProposer([{"kv_cache_dtype": "auto"}]), 1)
        runner = RoundRunner(
            prof,
            ledger,
            NullSink(),
            testbed,
            OptunaProposer(seed=0),
            ApprovalGate(ledger, "auto"),
            RoundDisplay(Console(file=io.StringIO())),
        )
        rnd = ledger.create_round(
            cluster=prof.cluster.name, profile_name=prof.name, profile_digest=prof.digest,
            budget=1, proposer="optuna", approve="auto", seed=0,
        )  # fmt: skip
        # what the round does before its crashpoint "proposal.recorded"
        pending = runner.intake.record(rnd, OptunaProposer(seed=0).propose(runner.context(rnd)))
        assert pending.coupled_knob == "gpu_memory_utilization" and pending.coupled_new == 0.86
        report = runner.run(RoundOptions(budget=1, proposer="optuna", approve="auto", seed=0))
    assert report.resumed
    [pair] = [e for e in report.experiments if e.kind == Kind.CANDIDATE]
    assert pair.proposal_id == pending.id
    assert pair.config["kv_cache_dtype"] == "auto"
    assert pair.config["gpu_memory_utilization"] == 0.86
    assert pair.label == "kv_cache_dtype+gpu_memory_utilization" and pair.objective


def test_the_llm_digest_lists_a_coupled_move_apart_from_its_first_knobs_values() -> None:
    pair = KV_AUTO.apply(SPACE.change(KV_AUTO, "gpu_memory_utilization", 0.86))
    entries = (
        crashed(2, KV_AUTO, "kv_cache_dtype", "auto", "kv_capacity"),
        crashed(
            3, pair, "kv_cache_dtype", "auto", "kv_capacity",
            coupled=("gpu_memory_utilization", 0.86),
        ),
    )  # fmt: skip
    text = digest(context(entries, (kv_short(0.85), kv_short(0.86))))
    [line] = [ln for ln in text.splitlines() if ln.startswith("- kv_cache_dtype:")]
    assert "crash×1" in line and "crash×2" not in line, line
    said = "experiment #3 kv_cache_dtype=auto+gpu_memory_utilization=0.86: crash [kv_capacity]"
    assert said in text


def test_coupled_moves_lift_the_two_node_stacks_ceiling() -> None:
    """On sm121-2node's noise-free truth, the best a loop that keeps only true gains of at
    least 0.1 % reaches: 98.1 % of the optimum in one-knob steps (the memory step that lets
    the BF16 cache fit gains nothing), the optimum with the coupled move."""
    landscape = load_landscape("sm121-2node")
    optimum = float(landscape.optimum()["objective"])
    alone = ceiling(landscape, 0.1) / optimum
    coupled = ceiling(landscape, 0.1, coupled=True) / optimum
    assert alone == pytest.approx(0.981, abs=0.001) and coupled == pytest.approx(1.0)
    path = widest_path(landscape, 0.99 * optimum, coupled=True)
    assert path is not None
    assert path[0][0] == ("kv_cache_dtype fp8_e4m3 → auto + gpu_memory_utilization 0.85 → 0.86")
    assert min(gain for _, gain in path) > 2.0


@pytest.mark.parametrize("kind", ["claude", "hybrid"])
def test_the_llm_proposers_take_an_open_coupled_move_before_any_call(
    messages_api: MessagesApi, kind: str
) -> None:
    """The model's tool names one knob, so it cannot propose the move; the proposer takes it
    itself, as the digest tells the model, and spends no call on it."""
    ctx = context(
        (crashed(2, KV_AUTO, "kv_cache_dtype", "auto", "kv_capacity"),), (kv_short(0.85),)
    )
    [move] = ctx.coupled_moves()
    options = ClaudeOptions(api_retries=0)
    optuna = OptunaProposer(seed=0)
    proposer = (
        ClaudeProposer(options, fallback=optuna, base_url=messages_api.url)
        if kind == "claude"
        else HybridProposer(options, optuna=optuna, base_url=messages_api.url)
    )
    try:
        proposal = proposer.propose(ctx)
    finally:
        proposer.close()
    assert proposal.change == move.change and proposal.source == kind
    assert proposal.notes[COUPLED_NOTE] == move.why()
    assert messages_api.requests == []
    # once decided under this champion, the move is closed: the next proposal is the model's
    done = crashed(
        3,
        CHAMPION.apply(move.change),
        "kv_cache_dtype",
        "auto",
        "kv_capacity",
        coupled=("gpu_memory_utilization", 0.86),
    )
    assert context((*ctx.history, done), ctx.known_bad).coupled_moves() == []
