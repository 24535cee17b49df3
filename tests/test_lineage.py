"""A change's parent (the champion it changed one knob of) is stored as the change is
recorded (``experiment.parent_experiment_id``, schema 8) and read from there; a change an older
release recorded has none stored, and its parent is inferred as before
(``evolution.Lineage.parent``). On real SQLite ledgers; a round on the rendering testbed."""

from __future__ import annotations

from pathlib import Path

from knobs import KnobSpace, catalog
from knobs.vocabulary import Kind
from ledger import ExperimentRecord, Ledger
from orchestrator.evolution import Lineage
from tests.test_ledger import _keep, _new_round
from tests.test_profile_evolution import run_round

SPACE = KnobSpace(knobs=catalog("vllm-dflash2"))


def _ids(lineage: Lineage, experiments: list[ExperimentRecord]) -> list[int | None]:
    parents = (lineage.parent(e) for e in experiments)
    return [None if p is None else p.id for p in parents]


def test_a_round_stores_each_changes_parent_as_the_inference_had_it(tmp_path: Path) -> None:
    run_round(tmp_path, 3)
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        experiments = ledger.experiments(cluster="evolving")
        stored = [e.parent_experiment_id for e in experiments]
        # what the inference makes of the same rows without it (an older release's rows)
        bare = [e.model_copy(update={"parent_experiment_id": None}) for e in experiments]
        inferred = _ids(Lineage.read(SPACE, ledger, "evolving", bare), bare)
    assert [e.kind for e in experiments] == [Kind.BASELINE] + [Kind.CANDIDATE] * 3
    assert stored[0] is None and None not in stored[1:], stored
    assert stored == inferred


def test_the_stored_parent_is_read_and_an_older_rows_is_inferred(tmp_path: Path) -> None:
    """e1 (baseline) and e2 kept in turn; e3 recorded against e1 (as a proposal made before
    e2's keep is), e4 written as an older release writes, with no parent stored. The stored
    parent is read as it is; the other is inferred, the last champion below it (e2)."""
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        rnd = _new_round(ledger, budget=3, proposer="sweep", seed=0)
        base = SPACE.default_config()

        def add(kind: Kind, parent: int | None, k: int) -> ExperimentRecord:
            config = (
                base
                if kind == Kind.BASELINE
                else base.apply(SPACE.change(base, "num_speculative_tokens", k))
            )
            return ledger.add_experiment(
                cluster="c",
                round_id=rnd.id,
                kind=kind,
                config=config,
                champion_key=None if kind == Kind.BASELINE else base.key,
                champion_objective=None if kind == Kind.BASELINE else 100.0,
                knob=None if kind == Kind.BASELINE else "num_speculative_tokens",
                value=None if kind == Kind.BASELINE else k,
                parent=parent,
            )

        e1 = add(Kind.BASELINE, None, 0)
        ledger.decide(
            e1.id, verdict=_keep(), objective=100.0, delta_pct=0.0, accept_len=None, promote=True
        )
        e2 = add(Kind.CANDIDATE, e1.id, 5)
        ledger.decide(
            e2.id, verdict=_keep(), objective=110.0, delta_pct=10.0, accept_len=None, promote=True
        )
        e3 = add(Kind.CANDIDATE, e1.id, 4)
        e4 = add(Kind.CANDIDATE, None, 3)
        experiments = ledger.experiments(cluster="c")
        assert [e.parent_experiment_id for e in experiments] == [None, e1.id, e1.id, None]
        assert _ids(Lineage.read(SPACE, ledger, "c", experiments), experiments) == [
            None,
            e1.id,
            e1.id,  # stored: the inference would have had e2, the champion below it
            e2.id,  # none stored: inferred
        ]
        assert _ids(Lineage.lazy(SPACE, ledger, "c"), [e3, e4]) == [e1.id, e2.id]
