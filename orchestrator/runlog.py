"""The round's run log in MLflow: one parent run per round, one child run per experiment.

The ledger is the record; this is its mirror for people. Every write goes through the
``Sink`` protocol (MLflow, or nothing in the research benchmark), and a child run's id is
committed to the ledger as soon as it exists, so a resumed round logs into the same run.

A kill can land between a ledger write and its mirror: ``reconcile`` completes, from the
ledger, what MLflow lacks (a decided experiment's run left open or never created, a champion's
re-measurement not logged), and a run created just before a kill is found by its tags and
adopted rather than created twice.

MLflow that stops answering mid-round is never the night's end (``orchestrator.mirror``): the
round goes on with the ledger as its record, and ``reconcile`` fills MLflow in when it answers
again. A round closes only with its mirror complete (``complete_round``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence

from agents import COUPLED_NOTE, METRIC_NOTES, TAG_NOTES
from cluster.errors import NodeError
from knobs.records import CellResultRecord
from knobs.spec import Value, as_text, clipped
from knobs.vocabulary import Kind, State, Status
from ledger import (
    ExperimentRecord,
    Ledger,
    MlflowSinkError,
    ProposalRecord,
    RoundRecord,
    VerdictRecord,
)
from orchestrator.crashpoints import crashpoint
from orchestrator.display import describe
from orchestrator.measurements import BootCount
from orchestrator.mirror import RETRY_S, Mirror
from orchestrator.testbed import Sink

#: The tag that finds a round's parent run again: the ledger's round and when it started (no
#: "key" in its name: the redactor would mask a tag named so).
TAG_ROUND_STARTED = "orchestrate.round_started"
_PARENT = "mlflow.parentRunId"
_EXPERIMENT = "orchestrate.experiment"
_REMEASURE = "remeasure.objective"
#: How a decided experiment's run ends, by its status: a crash ``FAILED``, every other
#: ``FINISHED``. A veto too: it is a person's decision, not a failure, and MLflow's UI reads
#: ``KILLED`` as a run killed or crashed; its ``status`` tag and its name say ``vetoed``.
_ENDED = {Status.CRASH: "FAILED"}


class RunLog:
    """Writes a round's experiments, boots and verdicts to MLflow."""

    def __init__(
        self,
        ledger: Ledger,
        sink: Sink,
        *,
        note: Callable[[str], None] = lambda _line: None,
        clock: Callable[[], float] = time.monotonic,
        retry_s: float = RETRY_S,
    ) -> None:
        self.ledger = ledger
        self.sink = sink
        self.mirror = Mirror(note=note, clock=clock, retry_s=retry_s)

    def complete_round(self, rnd: RoundRecord) -> None:
        """MLflow complete for round ``rnd`` (``reconcile``), then its parent run ended.

        Raises:
            MlflowSinkError: MLflow did not answer; the message says the round stays open and
                the same command completes and closes it.
        """
        try:
            self.reconcile(rnd)
            with self.mirror.strictly():
                self.finish_round(rnd)
        except MlflowSinkError as e:
            raise MlflowSinkError(
                f"round {rnd.id}: every experiment is decided and in the ledger (results.tsv "
                f"has them), but MLflow did not answer, so the round stays open; run the same "
                f"command when MLflow answers and it fills MLflow in and closes the round "
                f"({e.message})",
                tracking_uri=e.tracking_uri,
                operation=e.operation,
            ) from e

    def round_run(self, rnd: RoundRecord) -> RoundRecord:
        """The round with its parent run (started, and committed to the ledger, if new)."""
        if rnd.mlflow_run_id is not None:
            return rnd
        return self._new_round_run(rnd)

    def _new_round_run(self, rnd: RoundRecord) -> RoundRecord:
        """A parent run for ``rnd`` (or the one a kill left before its id reached the ledger),
        its id committed to the ledger; its params are the round's, as the ledger has them."""
        key = f"{rnd.cluster}/{rnd.id}/{rnd.started_at.isoformat()}"
        run_id = self.sink.find_run({TAG_ROUND_STARTED: key})
        if run_id is None:
            run_id = self.sink.start_round(
                round_id=rnd.id,
                cluster=rnd.cluster,
                params={
                    "profile": rnd.profile_name,
                    "profile_digest": rnd.profile_digest,
                    "budget": str(rnd.budget),
                    "proposer": rnd.proposer,
                    "approve": rnd.approve,
                    "seed": str(rnd.seed),
                },
                tags={TAG_ROUND_STARTED: key},
            )
            crashpoint("mlflow.round.created")
        self.ledger.set_round_mlflow(rnd.id, run_id)
        return self.ledger.round(rnd.id)

    def finish_round(self, rnd: RoundRecord) -> None:
        """The parent run ends with the round (a round that stops short, its baseline's boot
        failed included, stays open: the same command resumes it)."""
        # the ledger's: a fill-in may have given the round a new one since ``rnd`` was read
        run_id = self.ledger.round(rnd.id).mlflow_run_id or ""
        self.mirror.write(lambda: self.sink.finish(run_id, "FINISHED"))

    def experiment_run(self, rnd: RoundRecord, e: ExperimentRecord) -> str | None:
        """The experiment's child run (started, with its config and proposal, if new); None
        while MLflow is behind and does not answer yet (``catch_up``)."""
        if not self.mirror.catch_up(lambda: self.reconcile(rnd), rnd.id):
            return None
        return self.mirror.write(lambda: self._run_of(rnd, e))

    def _run_of(self, rnd: RoundRecord, e: ExperimentRecord) -> str:
        if e.mlflow_run_id is not None:
            return e.mlflow_run_id
        return self._open(rnd, e)

    def _open(self, rnd: RoundRecord, e: ExperimentRecord) -> str:
        """A new run for ``e`` (or the one a kill left before its id reached the ledger), with
        its proposal, its id committed to the ledger."""
        # the ledger's: a fill-in may have given the round a new one since ``rnd`` was read
        parent = self.ledger.round(rnd.id).mlflow_run_id or ""
        run_id = self.sink.find_run({_PARENT: parent, _EXPERIMENT: str(e.id)})
        present: frozenset[str] = frozenset()
        if run_id is None:
            params: dict[str, object] = {k: as_text(v) for k, v in e.config.items()}
            params["description"] = describe(e)
            params["config_key"] = e.config.key
            if e.coupled_knob is not None:
                params["coupled"] = e.label  # a coupled move: the two knobs it changed
            run_id = self.sink.start_experiment(
                parent_run_id=parent,
                number=e.id,
                kind=e.kind,
                params=params,
                tags={
                    "knob": e.label or "-",
                    "experiment": str(e.id),
                    **({"coupled": "true"} if e.coupled_knob is not None else {}),
                },
            )
            crashpoint("mlflow.run.created")
            self.sink.rename(run_id, self._name(e))
        else:
            state = self.sink.run_state(run_id)
            present = state.metrics if state is not None else frozenset()
        if e.proposal_id is not None:
            self._proposal(run_id, self.ledger.proposal(e.proposal_id), present)
        self.ledger.set_experiment_mlflow(e.id, run_id)
        return run_id

    def _proposal(self, run_id: str, p: ProposalRecord, present: frozenset[str]) -> None:
        """The proposal on the experiment's run: who proposed, why, and what the LLM cost
        (``present``: metrics the run has already, not logged twice)."""
        metrics: dict[str, float] = {}
        for key in METRIC_NOTES:
            if key in p.notes and key not in present:
                try:
                    metrics[key] = float(p.notes[key])
                except ValueError:
                    continue
        tags = {key: p.notes[key] for key in TAG_NOTES if key in p.notes}
        tags.update(
            proposer=p.source,
            hypothesis=clipped(p.hypothesis, 500),
            expected_effect=clipped(p.expected_effect, 200),
            decided_by=p.decided_by or "",
        )
        if p.coupled_knob is not None and COUPLED_NOTE in p.notes:
            tags["coupled_because"] = clipped(p.notes[COUPLED_NOTE], 500)  # the failure it answers
        if metrics:
            self.sink.log_metrics(run_id, metrics)
        self.sink.set_tags(run_id, tags)

    def launchers(
        self, e: ExperimentRecord, run_id: str | None, launchers: Mapping[int, str]
    ) -> None:
        """Every node's rendered launcher for a boot of ``e``'s config."""
        self._texts(e, run_id, {f"launchers/node-{r}.sh": t for r, t in launchers.items()})

    def boot_logs(
        self, e: ExperimentRecord, run_id: str | None, boot_id: int, logs: Mapping[int, str]
    ) -> None:
        """Every node's engine log of one boot of ``e``'s config."""
        self._texts(e, run_id, {f"logs/boot-{boot_id}/node-{r}.log": t for r, t in logs.items()})

    def _texts(self, e: ExperimentRecord, run_id: str | None, texts: dict[str, str]) -> None:
        """``texts`` on ``e``'s run; while MLflow is behind, or where this store lacks the run,
        held in the ledger until it takes them (``_release``): the ledger keeps no other copy."""
        took = run_id is not None and self.mirror.write(
            lambda: self._on_run(run_id, lambda: self.sink.log_texts(run_id, texts))
        )
        if not took:
            self.ledger.hold_texts(e.id, texts)

    def _on_run(self, run_id: str, write: Callable[[], object]) -> bool:
        """``write()`` where this store has the run; whether it did. The champion's run of an
        earlier round is in the store that round logged to, which a round run with
        ``--new-mlflow-store`` does not log to: a write to it there failed as "Run … not
        found", which held the round open for good (each close tried it again). What it would
        have had stays in the ledger.

        Raises:
            MlflowSinkError: MLflow failed.
        """
        if self.sink.run_state(run_id) is None:
            return False
        write()
        return True

    def remeasured(self, run_id: str | None, objective: float, measurement: int) -> None:
        """A re-measurement of the champion, on the champion's run (where this store has it)."""
        if run_id is not None:
            metrics = {_REMEASURE: objective}
            self.mirror.write(
                lambda: self._on_run(
                    run_id, lambda: self.sink.log_metrics(run_id, metrics, step=measurement)
                )
            )

    def keep_boots_set_aside(self, run_id: str | None, measurement: int) -> None:
        """The champion's level starts again at ``measurement``: the boots that kept it were
        set aside (``ChampionRemeasure``), tagged on the champion's run (where this store has
        it)."""
        tags = {"keep_boots_set_aside_at": str(measurement)}
        if run_id is not None:
            self.mirror.write(
                lambda: self._on_run(run_id, lambda: self.sink.set_tags(run_id, tags))
            )

    def _name(self, e: ExperimentRecord, status: str | None = None) -> str:
        p = self.ledger.proposal(e.proposal_id) if e.proposal_id else None
        return run_name(
            e, None if p is None else p.old_value, status, None if p is None else p.coupled_old
        )

    def vetoed(self, run_id: str | None, e: ExperimentRecord, reason: str) -> None:
        """A vetoed proposal's run: tagged ``status: vetoed`` with the reason, and ended
        ``FINISHED`` without a boot (a person's decision, not a failure)."""
        if run_id is not None:
            self.mirror.write(lambda: self._vetoed(run_id, e, reason))

    def _vetoed(self, run_id: str, e: ExperimentRecord, reason: str) -> None:
        self.sink.set_tags(run_id, {"status": Status.VETOED, "veto_reason": reason})
        self.sink.rename(run_id, self._name(e, Status.VETOED))
        self.sink.finish(run_id, _ENDED.get(Status.VETOED, "FINISHED"))

    def crashed(self, run_id: str | None, e: ExperimentRecord, err: NodeError) -> None:
        """A crashed experiment's run: the failure's evidence, tagged, ended as failed."""
        if run_id is not None:
            self.mirror.write(lambda: self._crashed(run_id, e, err.failure_class, err.evidence()))

    def _crashed(self, run_id: str, e: ExperimentRecord, failure_class: str, evidence: str) -> None:
        self.sink.log_texts(run_id, {"failure.txt": evidence})
        self.sink.set_tags(run_id, {"status": Status.CRASH, "failure_class": failure_class})
        self.sink.rename(run_id, self._name(e, Status.CRASH))
        self.sink.finish(run_id, "FAILED")

    def decided(
        self,
        run_id: str | None,
        decided: ExperimentRecord,
        verdict: VerdictRecord,
        level: tuple[float, float],
        first_cells: Sequence[CellResultRecord],
        cells: Sequence[CellResultRecord],
        boots: BootCount,
        present: frozenset[str] = frozenset(),
    ) -> None:
        """A decided experiment's run: ``level`` (its objective and delta %), its boots (and
        how many failed) and the measurements its verdict weighed (``BootCount``), the
        verdict's statistics, the first boot's cells, the cells and verdict as JSON, status,
        rule and description (results.tsv's) as tags; ended.
        ``present``: metrics the run has already (a repair), not logged twice: a metric's
        history keeps one value per verdict."""
        if run_id is None:
            return
        stats = verdict.stats
        value, delta = level
        metrics: dict[str, float] = {
            "objective": value,
            "delta_pct": delta,
            "boots": boots.boots,
            "failed_boots": boots.failures,
            # what the verdict weighed: a measurement resumed on a new boot is two boots
            "measurements": boots.measurements,
        }
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
        metrics = {k: v for k, v in metrics.items() if k not in present}
        texts = {
            "cells.json": json.dumps([c.model_dump(mode="json") for c in cells], indent=2),
            "verdict.json": json.dumps(verdict.model_dump(mode="json"), indent=2),
        }

        def write() -> None:
            if metrics:
                self.sink.log_metrics(run_id, metrics)
            self.sink.log_texts(run_id, texts)
            # what results.tsv says of it now (the param is what it said when it opened: a
            # change stopped for want of boots says which look it is open for once decided)
            tags = {
                "status": verdict.status,
                "rule": verdict.rule,
                "description": describe(decided),
            }
            self.sink.set_tags(run_id, tags)
            self.sink.rename(run_id, self._name(decided, verdict.status))
            self.sink.finish(run_id, "FINISHED")

        self.mirror.write(write)

    # ---- what a kill left undone ------------------------------------------------------------
    def reconcile(self, rnd: RoundRecord) -> list[int]:
        """Complete in MLflow, from the ledger, what a kill left undone in round ``rnd``: every
        decided experiment's run created if it never was, and ended with its verdict's
        metrics, artifacts and tags if it is still open or lacks them; every re-measurement
        of the champion recorded in the round logged. The same writes the round makes, made
        idempotent (a metric the run has is not logged again; an artifact is overwritten).
        The experiments whose runs were completed.

        Raises:
            MlflowSinkError: MLflow failed.
            LedgerError: the ledger failed.
        """
        with self.mirror.strictly():
            return self._reconcile(self.ledger.round(rnd.id))

    def _reconcile(self, rnd: RoundRecord) -> list[int]:
        if rnd.mlflow_run_id is not None and self.sink.run_state(rnd.mlflow_run_id) is None:
            # MLflow no longer has the round's run (a new tracking server or store, the run
            # deleted by hand): a new one, and each experiment's run opened again under it
            rnd = self._new_round_run(rnd)
        repaired: list[int] = []
        for e in self.ledger.experiments(round_id=rnd.id):
            if e.state != State.DECIDED or e.status is None:
                continue
            run_id = self._run_of(rnd, e)
            state = self.sink.run_state(run_id)
            if state is None:  # the ledger names a run MLflow no longer has
                run_id = self._open(rnd, e.model_copy(update={"mlflow_run_id": None}))
                state = self.sink.run_state(run_id)
            ended = _ENDED.get(e.status, "FINISHED")
            if state is not None and state.status == ended and state.tags.get("status") == e.status:
                continue
            self._complete(run_id, e, state.metrics if state is not None else frozenset())
            repaired.append(e.id)
        self._remeasures(rnd)
        self._release(rnd.cluster)
        return repaired

    def _complete(self, run_id: str, e: ExperimentRecord, present: frozenset[str]) -> None:
        """``e``'s verdict written to its run as the round writes it, from the ledger."""
        if e.status == Status.VETOED:
            # the person's words: a proposal's veto, or an undecided experiment's
            vetoed = self.ledger.verdict(e.id)
            self.vetoed(run_id, e, "" if vetoed is None else vetoed.reason)
            return
        if e.status == Status.CRASH:
            self._crashed(run_id, e, e.failure_class or "unknown", e.failure_detail or "")
            return
        verdict = self.ledger.verdict(e.id)
        assert verdict is not None  # decided: the verdict came in the same transaction
        # the boots it was decided on: those before the verdict (a champion boots again later)
        boots = self.ledger.boots(e.id)
        decided_at = e.decided_at
        measurement = {
            b.id: b.measurement for b in boots if decided_at is None or b.started_at <= decided_at
        }
        cells = [
            (measurement[r.boot_id], r.result)
            for r in self.ledger.cell_results(e.id)
            if r.boot_id in measurement
        ]
        first = min((m for m, _ in cells), default=0)
        self.decided(
            run_id,
            e,
            verdict,
            (e.objective or 0.0, e.delta_pct or 0.0),
            [c for m, c in cells if m == first],
            [c for _, c in cells],
            BootCount.of(e, boots, verdict),
            present,
        )

    def _release(self, cluster: str) -> None:
        """The texts the ledger held for MLflow, on their runs, then forgotten; an experiment
        without a run in MLflow yet (in flight) keeps them until the next time."""
        for experiment_id in self.ledger.holding(cluster):
            run_id = self.ledger.experiment(experiment_id).mlflow_run_id
            if run_id is None or self.sink.run_state(run_id) is None:
                continue
            held = self.ledger.held_texts(experiment_id)
            self.sink.log_texts(run_id, {h.path: h.text for h in held})
            self.ledger.release_texts([h.id for h in held])

    def _remeasures(self, rnd: RoundRecord) -> None:
        """Each re-measurement of the champion since the round started, on its run."""
        for d in self.ledger.drifts(rnd.cluster):
            if d.created_at < rnd.started_at:
                continue
            run_id = self.ledger.experiment(d.experiment_id).mlflow_run_id
            if run_id is None or self.sink.run_state(run_id) is None:
                continue  # no run of it in this store (``_on_run``)
            if d.measurement not in self.sink.metric_steps(run_id, _REMEASURE):
                self.remeasured(run_id, d.after, d.measurement)


def run_name(
    e: ExperimentRecord,
    old: Value | None,
    status: str | None = None,
    coupled_old: Value | None = None,
) -> str:
    """The name an experiment's run is listed by in MLflow: ``exp-7 · num_speculative_tokens
    7→5 · discard`` (the verdict once there is one), ``exp-1 · baseline · keep``; ``old``: the
    changed knob's value before (``None``: unknown). A coupled move names both knobs:
    ``exp-9 · kv_cache_dtype fp8_e4m3→auto + gpu_memory_utilization 0.85→0.86 · keep``
    (``coupled_old``: the enabling knob's value before)."""
    if e.kind == Kind.BASELINE or e.knob is None:
        change = "baseline"
    else:
        before = "?" if old is None else as_text(old)
        after = "?" if e.value is None else as_text(e.value)
        change = f"{e.knob} {before}→{after}"
        if e.coupled_knob is not None:
            was = "?" if coupled_old is None else as_text(coupled_old)
            now = "?" if e.coupled_value is None else as_text(e.coupled_value)
            change += f" + {e.coupled_knob} {was}→{now}"
    return " · ".join([f"exp-{e.id}", change, *([str(status)] if status else [])])
