"""The round's run log in MLflow: one parent run per round, one child run per experiment.

The ledger is the record; this is its mirror for people. Every write goes through the
``Sink`` protocol (MLflow, or nothing in the research benchmark), and a child run's id is
committed to the ledger as soon as it exists, so a resumed round logs into the same run.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from agents import METRIC_NOTES, TAG_NOTES
from cluster.errors import NodeError
from knobs.records import CellResultRecord
from knobs.spec import as_text
from knobs.vocabulary import Status
from ledger import ExperimentRecord, Ledger, ProposalRecord, RoundRecord, VerdictRecord
from orchestrator.display import describe
from orchestrator.profile import Profile
from orchestrator.testbed import Sink


class RunLog:
    """Writes a round's experiments, boots and verdicts to MLflow."""

    def __init__(self, ledger: Ledger, sink: Sink) -> None:
        self.ledger = ledger
        self.sink = sink

    def round_run(self, rnd: RoundRecord, profile: Profile, cluster: str) -> RoundRecord:
        """The round with its parent run (started, and committed to the ledger, if new)."""
        if rnd.mlflow_run_id is not None:
            return rnd
        run_id = self.sink.start_round(
            round_id=rnd.id,
            cluster=cluster,
            params={
                "profile": profile.name,
                "profile_digest": profile.digest,
                "budget": str(rnd.budget),
                "proposer": rnd.proposer,
                "approve": rnd.approve,
                "seed": str(rnd.seed),
            },
        )
        self.ledger.set_round_mlflow(rnd.id, run_id)
        return self.ledger.round(rnd.id)

    def finish_round(self, rnd: RoundRecord) -> None:
        """The parent run ends with the round."""
        self.sink.finish(rnd.mlflow_run_id or "", "FINISHED")

    def experiment_run(self, rnd: RoundRecord, e: ExperimentRecord) -> str:
        """The experiment's child run (started, with its config and proposal, if new)."""
        if e.mlflow_run_id is not None:
            return e.mlflow_run_id
        params: dict[str, object] = {k: as_text(v) for k, v in e.config.items()}
        params["description"] = describe(e)
        params["config_key"] = e.config.key
        run_id = self.sink.start_experiment(
            parent_run_id=rnd.mlflow_run_id or "",
            number=e.id,
            kind=e.kind,
            params=params,
            tags={"knob": e.knob or "-", "experiment": str(e.id)},
        )
        self.ledger.set_experiment_mlflow(e.id, run_id)
        if e.proposal_id is not None:
            self._proposal(run_id, self.ledger.proposal(e.proposal_id))
        return run_id

    def _proposal(self, run_id: str, p: ProposalRecord) -> None:
        """The proposal on the experiment's run: who proposed, why, and what the LLM cost."""
        metrics: dict[str, float] = {}
        for key in METRIC_NOTES:
            if key in p.notes:
                try:
                    metrics[key] = float(p.notes[key])
                except ValueError:
                    continue
        tags = {key: p.notes[key] for key in TAG_NOTES if key in p.notes}
        tags.update(
            proposer=p.source,
            hypothesis=p.hypothesis[:500],
            expected_effect=p.expected_effect[:200],
            decided_by=p.decided_by or "",
        )
        if metrics:
            self.sink.log_metrics(run_id, metrics)
        self.sink.set_tags(run_id, tags)

    def launchers(self, run_id: str, launchers: Mapping[int, str]) -> None:
        """Every node's rendered launcher for a boot."""
        self.sink.log_texts(
            run_id, {f"launchers/node-{r}.sh": text for r, text in launchers.items()}
        )

    def boot_logs(self, run_id: str, boot_id: int, logs: Mapping[int, str]) -> None:
        """Every node's engine log of one boot."""
        self.sink.log_texts(
            run_id, {f"logs/boot-{boot_id}/node-{r}.log": t for r, t in logs.items()}
        )

    def remeasured(self, run_id: str, objective: float, measurement: int) -> None:
        """A re-measurement of the champion, on the champion's run."""
        self.sink.log_metrics(run_id, {"remeasure.objective": objective}, step=measurement)

    def vetoed(self, run_id: str, reason: str) -> None:
        """A vetoed proposal's run: tagged and ended without a boot."""
        self.sink.set_tags(run_id, {"status": Status.VETOED, "veto_reason": reason})
        self.sink.finish(run_id, "KILLED")

    def crashed(self, run_id: str, err: NodeError) -> None:
        """A crashed experiment's run: the failure's evidence, tagged, ended as failed."""
        self.sink.log_texts(run_id, {"failure.txt": err.evidence()})
        self.sink.set_tags(run_id, {"status": Status.CRASH, "failure_class": err.failure_class})
        self.sink.finish(run_id, "FAILED")

    def decided(
        self,
        run_id: str,
        decided: ExperimentRecord,
        verdict: VerdictRecord,
        level: tuple[float, float],
        first_cells: Sequence[CellResultRecord],
        cells: Sequence[CellResultRecord],
        boots: int,
    ) -> None:
        """A decided experiment's run: ``level`` (its objective and delta %), the verdict's
        statistics, the first boot's cells, the cells and verdict as JSON, status and rule as
        tags; ended."""
        stats = verdict.stats
        value, delta = level
        metrics: dict[str, float] = {"objective": value, "delta_pct": delta, "boots": boots}
        for name in ("p_gain", "p_worth", "se", "boot_cv"):
            stat = stats.get(name)
            if isinstance(stat, float):
                metrics[name] = stat
        for cell in first_cells:
            metrics[f"{cell.cell}.output_throughput"] = cell.output_throughput
            metrics[f"{cell.cell}.p90_ttft_ms"] = cell.p90_ttft_ms
            if cell.accepted_per_step is not None:
                metrics[f"{cell.cell}.accepted_per_step"] = cell.accepted_per_step
        if decided.accept_len is not None:
            metrics["accept_len"] = decided.accept_len
        self.sink.log_metrics(run_id, metrics)
        self.sink.log_texts(
            run_id,
            {
                "cells.json": json.dumps([c.model_dump(mode="json") for c in cells], indent=2),
                "verdict.json": json.dumps(verdict.model_dump(mode="json"), indent=2),
            },
        )
        self.sink.set_tags(run_id, {"status": verdict.status, "rule": verdict.rule})
        self.sink.finish(run_id, "FINISHED")
