"""A change the verdict stops for want of boots, and the second look it is given: the record
says both as one story. Its status is ``inconclusive`` (a status word of results.tsv's
contract), not ``discard``, which reads as barred: nothing was concluded of it; its
description and reason say it is open for a second look, and the second look's description
names the look before it — in results.tsv, the report, the verdict and MLflow alike. A real
round on the simulated two-node stack, a real ledger and MLflow."""

from __future__ import annotations

import io
from pathlib import Path

from mlflow.tracking import MlflowClient
from rich.console import Console

from agents import OptunaProposer
from cluster.simulated import SimulatedTestbed
from cluster.twin.landscape import load_landscape
from knobs.vocabulary import Kind, Status
from ledger import Ledger, tsv_text
from ledger.mlflow_sink import MlflowSink
from orchestrator.approval import ApprovalGate
from orchestrator.display import RoundDisplay
from orchestrator.profile import Profile
from orchestrator.report.data import collect
from orchestrator.round import RoundOptions, RoundRunner
from tests.fixtures.mlflow_store import MlflowStore
from tests.test_pooling import profile


def test_a_change_stopped_for_want_of_boots_says_its_second_look_which_names_it(
    tmp_path: Path, mlflow_db: MlflowStore
) -> None:
    """CUDA graphs on the two-node stack (+4.8 %, its first boot measured less): the verdict
    stops it on futility while it still promises a gain, and the proposer looks at it again at
    once. Before, the first look read `discard` with "not worth another boot in this look" and
    `cuda_graphs false → true (optuna)` everywhere, then the same change came back as `(optuna,
    second look)`: discarded, then tried again, with nothing tying the two."""
    landscape = load_landscape("sm121-2node")
    data = profile(tmp_path).model_dump(mode="json", exclude_unset=True)
    data.update(knob_catalog=landscape.catalog, cells=[c.model_dump() for c in landscape.cells()])
    data["proposer"] = {"kind": "optuna", "seed": 0}
    prof = Profile.model_validate(data)
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        RoundRunner(
            prof,
            ledger,
            MlflowSink(),
            SimulatedTestbed(landscape, 0),
            OptunaProposer(seed=0),
            ApprovalGate(ledger, "auto"),
            RoundDisplay(Console(file=io.StringIO())),
        ).run(RoundOptions(budget=6, proposer="optuna", approve="auto", seed=0))
        experiments = [e for e in ledger.experiments() if e.kind == Kind.CANDIDATE]
        verdicts = {e.id: ledger.verdict(e.id) for e in experiments}
        tsv = {
            int(line.split("\t")[0]): line.split("\t")
            for line in tsv_text(ledger.experiments()).splitlines()[1:]
        }
        labels = {p.experiment: p.label for p in collect(prof, ledger).points}
    client = MlflowClient(tracking_uri=mlflow_db.tracking_uri)

    seconds = 0
    rules = set()
    for e in experiments:
        earlier = [
            x
            for x in experiments
            if x.id < e.id and x.config.key == e.config.key and x.champion_key == e.champion_key
        ]
        if len(earlier) != 1:
            continue
        seconds += 1
        [first] = earlier
        verdict = verdicts[first.id]
        assert verdict is not None and verdict.rule in ("futility", "max-boots")
        rules.add(verdict.rule)
        # open for another look, nothing concluded: inconclusive, by the futility rule too
        # (it read `discard`, and a user of results.tsv took the value for barred)
        assert first.status == verdict.status == Status.INCONCLUSIVE, (first.id, verdict)
        opened = "stopped for want of boots, open for a second look (it still promises +"
        assert f"(optuna); {opened}" in first.description, first.description
        assert "; open for a second look (it still promises +" in verdict.reason, verdict.reason
        assert f"(optuna, second look after #{first.id})" in e.description, e.description
        # every surface says the same of both
        for x in (first, e):
            assert tsv[x.id][4] == x.status and tsv[x.id][7] == x.description
            assert labels[x.id] == x.description
            assert x.mlflow_run_id is not None
            tags = client.get_run(x.mlflow_run_id).data.tags
            assert (tags["description"], tags["status"]) == (x.description, x.status)
        assert tsv[first.id][4] == "inconclusive"
    assert seconds, [(e.id, e.description) for e in experiments]
    assert "futility" in rules, rules
