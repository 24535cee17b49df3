"""The round loop as a persisted state machine.

Each experiment moves approved → deploying → benching → measured → decided, every step
committed to the ledger before the next begins. Running the same command after a kill picks
up the unfinished round where the ledger says it stopped: a cell already recorded is not
measured again, no engine is left running unrecorded, and the round's budget is honoured.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from agents import (
    METRIC_NOTES,
    TAG_NOTES,
    ChampionCell,
    HistoryEntry,
    KnownBad,
    Proposal,
    ProposalContext,
    ProposalExhausted,
    Proposer,
    round_spend,
)
from cluster.errors import NodeError
from knobs.config import Config
from knobs.errors import OrchestrateError
from knobs.records import CellResultRecord
from knobs.spec import EffectPrior, Value, as_text
from ledger import (
    ChampionRecord,
    ExperimentRecord,
    Ledger,
    ProposalRecord,
    RoundRecord,
    VerdictRecord,
)
from orchestrator.approval import ApprovalGate
from orchestrator.display import RoundDisplay, describe
from orchestrator.noise import NoiseModel, learn
from orchestrator.profile import Profile, VerdictSpec
from orchestrator.testbed import Sink, Testbed
from orchestrator.verdict import (
    Assessment,
    Evidence,
    accept_len,
    assess,
    objective,
    objective_of,
    slow_ranks,
)


class BaselineFailed(OrchestrateError):
    """The champion as configured does not boot or measure: nothing to compare against."""

    exit_code = 6


@dataclass(frozen=True)
class RoundOptions:
    """What ``orchestrate round`` was asked for."""

    budget: int
    proposer: str
    approve: str
    max_hours: float | None = None
    seed: int = 0


@dataclass(frozen=True)
class RoundReport:
    """What a round did."""

    round: RoundRecord
    experiments: list[ExperimentRecord]
    champion: ChampionRecord | None
    resumed: bool
    stopped_by: str


class RoundRunner:
    """Runs (or resumes) one round on one cluster."""

    def __init__(
        self,
        profile: Profile,
        ledger: Ledger,
        sink: Sink,
        testbed: Testbed,
        proposer: Proposer,
        gate: ApprovalGate,
        display: RoundDisplay,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.profile = profile
        self.ledger = ledger
        self.sink = sink
        self.testbed = testbed
        self.proposer = proposer
        self.gate = gate
        self.display = display
        self.cluster = profile.cluster.name
        self._clock = clock

    # ---- the loop ---------------------------------------------------------------------------
    def run(self, options: RoundOptions) -> RoundReport:
        """Run the round to its budget.

        Raises:
            BaselineFailed: no champion exists and the configured one crashed.
            LedgerError, MlflowSinkError: the ledger or MLflow failed.
        """
        started = self._clock()
        existing = self.ledger.unfinished_round(self.cluster)
        resumed = existing is not None
        rnd = existing or self.ledger.create_round(
            cluster=self.cluster,
            profile_name=self.profile.name,
            profile_digest=self.profile.digest,
            budget=options.budget,
            proposer=options.proposer,
            approve=options.approve,
            seed=options.seed,
        )
        if rnd.mlflow_run_id is None:
            run_id = self.sink.start_round(
                round_id=rnd.id,
                cluster=self.cluster,
                params={
                    "profile": self.profile.name,
                    "profile_digest": self.profile.digest,
                    "budget": str(rnd.budget),
                    "proposer": rnd.proposer,
                    "approve": rnd.approve,
                    "seed": str(rnd.seed),
                },
            )
            self.ledger.set_round_mlflow(rnd.id, run_id)
            rnd = self.ledger.round(rnd.id)
        done = self._candidates_done(rnd)
        verb = "resuming" if resumed else "starting"
        self.display.start(
            f"{verb} round {rnd.id} on {self.cluster} ({self.profile.name}): "
            f"{done} of {rnd.budget} experiments done, "
            f"proposer {rnd.proposer}, approve {rnd.approve}"
        )
        stopped_by = "budget"
        try:
            self._clean_up_stale_boots()
            for e in self.ledger.experiments(round_id=rnd.id):
                if e.state != "decided":
                    self._run_experiment(rnd, e)
            self._adopt_approved_proposals(rnd)
            if self.ledger.champion(self.cluster) is None:
                self._baseline(rnd)
            while self._candidates_done(rnd) < rnd.budget:
                if options.max_hours is not None and (
                    self._clock() - started > options.max_hours * 3600
                ):
                    stopped_by = "max-hours"
                    break
                self._maybe_remeasure(rnd)
                try:
                    experiment = self._next_experiment(rnd)
                except ProposalExhausted as e:
                    self.display.note(f"no allowed change is left: {e}")
                    stopped_by = "exhausted"
                    break
                if experiment is not None:
                    self._run_experiment(rnd, experiment)
        finally:
            self.display.stop()
        if stopped_by != "max-hours":
            self.ledger.finish_round(rnd.id, "done")
            self.sink.finish(rnd.mlflow_run_id or "", "FINISHED")
        return RoundReport(
            round=self.ledger.round(rnd.id),
            experiments=self.ledger.experiments(round_id=rnd.id),
            champion=self.ledger.champion(self.cluster),
            resumed=resumed,
            stopped_by=stopped_by,
        )

    def _candidates_done(self, rnd: RoundRecord) -> int:
        return sum(
            1
            for e in self.ledger.experiments(round_id=rnd.id)
            if e.kind == "candidate" and e.state == "decided" and e.status != "vetoed"
        )

    def _clean_up_stale_boots(self) -> None:
        """A killed orchestrator may have left engines up: stop every node, close the boots."""
        stale = [b for b in self.ledger.open_boots() if self._boot_is_ours(b.experiment_id)]
        if not stale:
            return
        self.display.phase("stopping engines left by an interrupted run")
        self.testbed.stop_all()
        for boot in stale:
            self.ledger.end_boot(
                boot.id, status="down", failure_class=None, failure_detail="interrupted"
            )

    def _boot_is_ours(self, experiment_id: int) -> bool:
        return self.ledger.experiment(experiment_id).cluster == self.cluster

    def _adopt_approved_proposals(self, rnd: RoundRecord) -> None:
        """An approved proposal whose experiment was never recorded (a kill in between)."""
        used = {e.proposal_id for e in self.ledger.experiments(round_id=rnd.id)}
        for p in self.ledger.proposals(round_id=rnd.id):
            if p.id in used:
                continue
            if p.status == "approved":
                self._run_experiment(rnd, self._experiment_for(rnd, p))
            elif p.status == "vetoed":
                self._record_veto(rnd, p)

    # ---- proposals --------------------------------------------------------------------------
    def context(self, rnd: RoundRecord) -> ProposalContext:
        """What the proposer sees now, built from the ledger."""
        champion = self.ledger.champion(self.cluster)
        assert champion is not None
        history: list[HistoryEntry] = []
        known_bad: list[KnownBad] = []
        decided = {champion.config.key}
        for e in self.ledger.experiments(cluster=self.cluster):
            if e.state != "decided" or e.status is None:
                continue
            history.append(
                HistoryEntry(
                    experiment=e.id,
                    config=e.config.as_dict(),
                    knob=e.knob,
                    value=e.value,
                    status=e.status,
                    objective=e.objective if e.status not in ("crash", "vetoed") else None,
                    delta_pct=e.delta_pct,
                    champion_key=e.champion_key or "",
                    failure_class=e.failure_class,
                )
            )
            # stuck clocks measured the node, not the config: it may run again
            if e.champion_key == champion.config.key and e.failure_class != "clocks_stuck":
                decided.add(e.config.key)
            if (
                e.knob is not None
                and e.value is not None
                and e.status in ("crash", "invalid", "vetoed")
                # stuck clocks are the node's fault, not the config's
                and e.failure_class != "clocks_stuck"
            ):
                source = {"crash": "crash", "invalid": "invalid", "vetoed": "veto"}[e.status]
                # a boot failure or a veto is pinned on the knob's value; wrong outputs come
                # from an interaction (graphs with one K), so only that whole config is barred
                when = e.config.as_dict() if e.status == "invalid" else {e.knob: e.value}
                reason = e.failure_class or (e.failure_detail or e.status)[:200]
                if e.status == "vetoed" and e.proposal_id is not None:
                    # the person's words, so every proposer learns why
                    reason = self.ledger.proposal(e.proposal_id).reason or "vetoed"
                region = (
                    self._crash_region(e.knob, e.value, e.config, e.failure_class)
                    if e.status == "crash"
                    else KnownBad(when=when, reason=reason, source=source)
                )
                known_bad.append(region.model_copy(update={"reason": reason, "source": source}))
        return ProposalContext(
            space=self.profile.space,
            champion=champion.config,
            champion_objective=champion.objective,
            history=tuple(history),
            known_bad=tuple(known_bad),
            decided_keys=frozenset(decided),
            budget_left=max(0, rnd.budget - self._candidates_done(rnd)),
            seed=rnd.seed,
            # LLM spend so far in this round, from the ledger: a resumed round keeps its cap
            llm_spend_usd=round_spend(p.notes for p in self.ledger.proposals(round_id=rnd.id)),
            champion_cells=self._champion_cells(),
        )

    def _champion_cells(self) -> tuple[ChampionCell, ...]:
        """The champion's cells, each averaged over its trusted measurements: throughput and,
        where every one of them reports it at the same length, the per-position acceptance."""
        by_cell: dict[str, list[CellResultRecord]] = {}
        for m in self._champion_measurements():
            if not self._trusted(m):
                continue
            for cell in m.cells:
                by_cell.setdefault(cell.cell, []).append(cell)
        out: list[ChampionCell] = []
        for name in sorted(by_cell):
            runs = by_cell[name]
            positions = [r.per_position_acceptance for r in runs]
            same = len({len(p) for p in positions}) == 1
            out.append(
                ChampionCell(
                    cell=name,
                    output_throughput=sum(r.output_throughput for r in runs) / len(runs),
                    per_position_acceptance=tuple(
                        sum(p[i] for p in positions) / len(positions)
                        for i in range(len(positions[0]))
                    )
                    if same
                    else (),
                )
            )
        return tuple(out)

    def _crash_region(
        self, knob: str, value: Value, config: Config, failure_class: str | None
    ) -> KnownBad:
        """The region a boot failure of ``knob=value`` bars.

        By default the value itself, under any champion. A failure the knob declares
        monotone (an OOM at a memory fraction) bars that whole side of the value instead. A
        failure another knob declares monotone (``kv_cache_dtype=auto`` short of KV-cache
        memory, which ``gpu_memory_utilization`` declares for ``kv_capacity``) bars the value
        only on that side of the other knob's value in the config that failed: a larger
        memory fraction may fit it.
        """
        space = self.profile.space
        own = space.spec(knob).monotone_failures if knob in space.names else {}
        side = own.get(failure_class or "")
        if side is not None and isinstance(value, int | float) and not isinstance(value, bool):
            bound = {knob: value}
            if side == "above":
                return KnownBad(at_least=bound, reason="", source="crash")
            return KnownBad(at_most=bound, reason="", source="crash")
        at_least: dict[str, int | float] = {}
        at_most: dict[str, int | float] = {}
        for spec in space.knobs:
            other = spec.monotone_failures.get(failure_class or "")
            held = config.get(spec.name)
            if other is None or spec.name == knob or isinstance(held, bool):
                continue
            if isinstance(held, int | float):
                (at_least if other == "above" else at_most)[spec.name] = held
        return KnownBad(
            when={knob: value}, at_least=at_least, at_most=at_most, reason="", source="crash"
        )

    def _next_experiment(self, rnd: RoundRecord) -> ExperimentRecord | None:
        """Propose, record, pass the veto gate; the experiment to run, or None if vetoed."""
        index = self._candidates_done(rnd) + 1
        self.display.experiment(index, rnd.budget, "proposing")
        self.display.phase(f"proposing ({self.proposer.name})")
        pending = [p for p in self.ledger.proposals(round_id=rnd.id, status="pending")]
        if pending:
            record = pending[0]
        else:
            proposal = self.proposer.propose(self.context(rnd))
            record = self._record_proposal(rnd, proposal)
        self.display.experiment(
            index,
            rnd.budget,
            f"{record.knob} {as_text(record.old_value)} → {as_text(record.new_value)}",
        )
        self.display.phase(f"waiting for approval ({rnd.approve})")
        decision = self.gate.decide(record, self.context(rnd))
        if decision.status == "vetoed":
            self._record_veto(rnd, decision)
            return None
        return self._experiment_for(rnd, decision)

    def _record_proposal(self, rnd: RoundRecord, proposal: Proposal) -> ProposalRecord:
        champion = self.ledger.champion(self.cluster)
        assert champion is not None
        return self.ledger.add_proposal(
            round_id=rnd.id,
            source=proposal.source,
            knob=proposal.change.knob,
            old_value=proposal.change.old,
            new_value=proposal.change.new,
            champion_key=champion.config.key,
            hypothesis=proposal.hypothesis,
            expected_effect=proposal.expected_effect,
            risk=proposal.risk,
            estimated_cost=proposal.estimated_cost,
            notes=dict(proposal.notes),
        )

    def _experiment_for(self, rnd: RoundRecord, p: ProposalRecord) -> ExperimentRecord:
        champion = self.ledger.champion(self.cluster)
        assert champion is not None
        change = self.profile.space.change(champion.config, p.knob, p.new_value)
        return self.ledger.add_experiment(
            cluster=self.cluster,
            round_id=rnd.id,
            kind="candidate",
            config=champion.config.apply(change),
            champion_key=champion.config.key,
            champion_objective=champion.objective,
            proposal_id=p.id,
            knob=change.knob,
            value=change.new,
            description=f"{change.describe()} ({p.source})",
        )

    def _record_veto(self, rnd: RoundRecord, p: ProposalRecord) -> None:
        champion = self.ledger.champion(self.cluster)
        assert champion is not None
        change = self.profile.space.change(champion.config, p.knob, p.new_value)
        e = self.ledger.add_experiment(
            cluster=self.cluster,
            round_id=rnd.id,
            kind="candidate",
            config=champion.config.apply(change),
            champion_key=champion.config.key,
            champion_objective=champion.objective,
            proposal_id=p.id,
            knob=change.knob,
            value=change.new,
            description=f"{change.describe()} vetoed by {p.decided_by}: {p.reason or ''}".strip(),
        )
        verdict = VerdictRecord(
            status="vetoed", rule="veto", reason=p.reason or "vetoed", stats={"by": p.decided_by}
        )
        decided = self.ledger.decide(
            e.id, verdict=verdict, objective=None, delta_pct=None, accept_len=None
        )
        run_id = self._child_run(rnd, decided)
        self.sink.set_tags(run_id, {"status": "vetoed", "veto_reason": p.reason or ""})
        self.sink.finish(run_id, "KILLED")
        self.display.decided(decided, verdict.reason)

    # ---- experiments ------------------------------------------------------------------------
    def _baseline(self, rnd: RoundRecord) -> None:
        config = self.profile.initial_champion()
        e = self.ledger.add_experiment(
            cluster=self.cluster,
            round_id=rnd.id,
            kind="baseline",
            config=config,
            champion_key=None,
            champion_objective=None,
            description="baseline",
        )
        self._run_experiment(rnd, e)

    def _child_run(self, rnd: RoundRecord, e: ExperimentRecord) -> str:
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
            self._log_proposal(run_id, self.ledger.proposal(e.proposal_id))
        return run_id

    def _log_proposal(self, run_id: str, p: ProposalRecord) -> None:
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

    def _run_experiment(self, rnd: RoundRecord, e: ExperimentRecord) -> None:
        """Boot and measure until the verdict is final; every boot and cell is committed."""
        index = self._candidates_done(rnd) + (1 if e.kind == "candidate" else 0)
        self.display.experiment(index if e.kind == "candidate" else 0, rnd.budget, describe(e))
        run_id = self._child_run(rnd, e)
        while True:
            e = self.ledger.experiment(e.id)
            if e.state == "decided":
                return
            measurements = self._measurements(e.id)
            unfinished = next((m for m in measurements if not m.complete), None)
            if unfinished is not None or not measurements:
                failure = self._measure(
                    e,
                    run_id,
                    role=unfinished.role if unfinished else "measure",
                    measurement=unfinished.index if unfinished else None,
                )
                if failure is not None:
                    self._crash(rnd, e, run_id, failure)
                    return
                continue
            if e.kind == "baseline":
                verdict = Assessment(
                    "keep", "baseline", "first measurement of the champion", {"delta_pct": 0.0}
                )
                self._decide(e, run_id, verdict, measurements)
                return
            # a boot with a node's clocks off measured the node, not the config: it is set
            # aside and the boot taken once more; off twice, the verdict rules it invalid
            slow = [m for m in measurements if not self._trusted(m)]
            if not self.profile.verdict.reboot_slow_clocks:
                slow = []
            if len(slow) == 1 and slow[0] is measurements[-1]:
                self.display.note(
                    "  a node's clocks were off during this boot: it is set aside and the "
                    "config booted once more"
                )
                failure = self._measure(e, run_id, role=slow[0].role, measurement=None)
                if failure is not None:
                    self._crash(rnd, e, run_id, failure)
                    return
                continue
            if len(slow) == 1:
                measurements = [m for m in measurements if m is not slow[0]]
            assessment = self._assess(e, measurements)
            if assessment.final:
                self._decide(e, run_id, assessment, measurements)
                return
            self.display.phase(assessment.reason)
            champion = self.ledger.champion(self.cluster)
            assert champion is not None
            # a confirmation is judged against the champion re-measured after the candidate's
            # last boot; while undecided, the verdict may ask for the champion's next boot
            if (
                assessment.status == "confirm"
                and self._last_boot_id(champion.experiment_id) < self._last_boot_id(e.id)
            ) or (
                assessment.stats.get("next_boot") == "champion"
                and self._champion_boots_during(champion.experiment_id, e.id)
                < 2 * self.profile.verdict.max_boots
            ):
                failure = self._remeasure_champion(rnd)
                if failure is not None:
                    verdict = Assessment(
                        "inconclusive",
                        "champion-remeasure",
                        f"the champion's re-measurement failed ({failure.failure_class}): "
                        f"{failure.message}",
                        {},
                    )
                    self._decide(e, run_id, verdict, measurements)
                    return
                continue
            if assessment.status == "more" and assessment.stats.get("next_boot") == "champion":
                # its boots keep not counting (a node's clocks off, drift after drift): decide
                # on what there is rather than boot it for ever
                booted = self._champion_boots_during(champion.experiment_id, e.id)
                self._decide(
                    e,
                    run_id,
                    Assessment(
                        "inconclusive",
                        "champion-remeasure",
                        f"{assessment.reason}: the champion was booted {booted} times for this "
                        "verdict, the most it may be",
                        dict(assessment.stats),
                    ),
                    measurements,
                )
                return
            role = "confirm" if assessment.status == "confirm" else "repeat"
            failure = self._measure(e, run_id, role=role, measurement=None)
            if failure is not None:
                self._crash(rnd, e, run_id, failure)
                return

    def _champion_boots_during(self, champion_id: int, experiment_id: int) -> int:
        """The champion's boots since the experiment's first boot (its re-measurements for
        this verdict)."""
        mine = self.ledger.boots(experiment_id)
        if not mine:
            return 0
        return sum(1 for b in self.ledger.boots(champion_id) if b.started_at >= mine[0].started_at)

    def _last_boot_id(self, experiment_id: int) -> int:
        boots = self.ledger.boots(experiment_id)
        return boots[-1].id if boots else 0

    def _measurements(self, experiment_id: int) -> list[Measurement]:
        """The experiment's measurements: boots grouped by measurement index, with cells."""
        boots = self.ledger.boots(experiment_id)
        by_boot: dict[int, list[CellResultRecord]] = {}
        for boot_id, _repeat, record in self.ledger.cell_results(experiment_id):
            by_boot.setdefault(boot_id, []).append(record)
        wanted = {c.name for c in self.profile.cells}
        out: dict[int, Measurement] = {}
        for boot in boots:
            m = out.setdefault(boot.measurement, Measurement(boot.measurement, boot.role, []))
            m.cells.extend(by_boot.get(boot.id, []))
        for m in out.values():
            m.complete = wanted <= {c.cell for c in m.cells}
        return [out[k] for k in sorted(out)]

    def _measure(
        self, e: ExperimentRecord, run_id: str, *, role: str, measurement: int | None
    ) -> NodeError | None:
        """One boot of ``e``'s config: deploy, the cells its measurement still lacks, teardown.
        The failure, if the boot or the bench failed."""
        if e.state != "decided":  # the champion's re-measurements add boots to a decided one
            self.ledger.set_state(e.id, "deploying")
        boot = self.ledger.start_boot(e.id, e.config, role=role, measurement=measurement)
        failure: NodeError | None = None
        try:
            self.display.phase(f"deploying ({role})")
            launchers = self.testbed.deploy(e.config)
            self.ledger.end_boot(boot.id, status="up")
            self.sink.log_texts(
                run_id, {f"launchers/node-{r}.sh": text for r, text in launchers.items()}
            )
            if e.state != "decided":
                self.ledger.set_state(e.id, "benching")
            self._bench(e.id, boot.id, boot.measurement)
        except NodeError as err:
            failure = err
        finally:
            # logs first (they are the evidence), then no engine may outlive the boot
            logs = self.testbed.logs()
            self.sink.log_texts(
                run_id, {f"logs/boot-{boot.id}/node-{r}.log": t for r, t in logs.items()}
            )
            self.display.phase("tearing down")
            try:
                self.testbed.stop_all()
            except NodeError as err:
                failure = failure or err
        if failure is not None:
            self.ledger.end_boot(
                boot.id,
                status="failed",
                failure_class=failure.failure_class,
                failure_detail=failure.message,
            )
            return failure
        self.ledger.end_boot(boot.id, status="down")
        if e.state != "decided":
            self.ledger.set_state(e.id, "measured")
        return None

    def _bench(self, experiment_id: int, boot_id: int, measurement: int) -> None:
        done = {
            c.cell
            for m in self._measurements(experiment_id)
            if m.index == measurement
            for c in m.cells
        }
        cells = self.profile.cells
        for i, cell in enumerate(cells, start=1):
            if cell.name in done:
                continue
            self.display.phase(f"cell {i} of {len(cells)}: {cell.name}")
            self.ledger.add_cell_result(experiment_id, boot_id, self.testbed.bench(cell))

    # ---- the champion and the noise ---------------------------------------------------------
    def _trusted(self, m: Measurement) -> bool:
        """Complete, and every node's clocks were right: what a level or a noise estimate may
        rest on."""
        return m.complete and not slow_ranks(m.cells, self.profile.gates.min_matmul_rate)

    def _champion_measurements(self) -> list[Measurement]:
        """The champion's complete measurements with every node's clocks right, since its last
        significant drift."""
        champion = self.ledger.champion(self.cluster)
        assert champion is not None
        complete = [m for m in self._measurements(champion.experiment_id) if m.complete]
        # a baseline measured only with a node's clocks off is all there is until re-measured
        measurements = [m for m in complete if self._trusted(m)] or complete
        cuts = [
            d.measurement
            for d in self.ledger.drifts(self.cluster)
            if d.experiment_id == champion.experiment_id and d.significant
        ]
        if cuts:
            measurements = [m for m in measurements if m.index >= max(cuts)] or measurements
        return measurements

    def noise(self) -> NoiseModel:
        """The cluster's noise model: the profile's prior and the ledger's repeated boots."""
        spec = self.profile.verdict.noise
        cuts: dict[int, list[int]] = {}
        for d in self.ledger.drifts(self.cluster):
            if d.significant:
                cuts.setdefault(d.experiment_id, []).append(d.measurement)
        groups: list[list[float]] = []
        for e in self.ledger.experiments(cluster=self.cluster):
            if e.status in ("crash", "vetoed", "invalid"):
                continue
            # a significant drift splits a config's boots: the level moved, not the noise
            segments: dict[int, list[float]] = {}
            for m in self._measurements(e.id):
                if self._trusted(m):
                    segment = sum(1 for c in cuts.get(e.id, []) if m.index >= c)
                    segments.setdefault(segment, []).append(objective(m.cells))
            groups.extend(v for v in segments.values() if len(v) >= 2)
        cells = max(1, len(self.profile.cells))
        return learn(
            prior_boot_cv=math.sqrt(spec.boot_to_boot**2 + spec.run_to_run**2 / cells),
            prior_run_cv=spec.run_to_run,
            prior_weight=spec.prior_weight,
            boot_groups=groups,
            run_groups=[],
        )

    def _remeasure_champion(self, rnd: RoundRecord) -> NodeError | None:
        """A fresh boot of the champion; records its drift and re-baselines on a real one.
        A boot with a node's clocks off is measured once more; it never counts as drift."""
        champion = self.ledger.champion(self.cluster)
        assert champion is not None
        before = [objective(m.cells) for m in self._champion_measurements()]
        e = self.ledger.experiment(champion.experiment_id)
        self.display.phase("re-measuring the champion")
        run_id = self._child_run(rnd, e)
        for attempt in (1, 2):
            failure = self._measure(e, run_id, role="remeasure", measurement=None)
            if failure is not None:
                self.display.note(f"  the champion's re-measurement failed: {failure.message}")
                return failure
            latest = [m for m in self._measurements(e.id) if m.complete][-1]
            if self._trusted(latest):
                break
            slow = ", ".join(map(str, slow_ranks(latest.cells, self.profile.gates.min_matmul_rate)))
            self.display.note(
                f"  the champion's re-measurement ran with clocks off on node(s) {slow}: "
                "it is neither drift nor the champion's level"
                + ("; measuring again" if attempt == 1 else "")
            )
        else:
            return None
        after = objective(latest.cells)
        noise = self.noise()
        old = objective_of(before) if before else after
        threshold = 2.0 * noise.boot_cv * math.sqrt(1.0 + 1.0 / max(1, len(before)))
        significant = abs(math.log(after / old)) > threshold if old > 0 and after > 0 else False
        drift = self.ledger.add_drift(
            cluster=self.cluster,
            experiment_id=e.id,
            measurement=latest.index,
            before=old,
            after=after,
            significant=significant,
        )
        trusted = [objective(m.cells) for m in self._champion_measurements()]
        self.ledger.set_champion_objective(self.cluster, objective_of(trusted))
        self.sink.log_metrics(run_id, {"remeasure.objective": after}, step=latest.index)
        if significant:
            self.display.note(
                f"  drift: the champion measured {drift.drift_pct:+.1f}% vs before; "
                "comparisons re-baselined on its new measurements"
            )
        return None

    def _maybe_remeasure(self, rnd: RoundRecord) -> None:
        """Re-measure the champion while it has fewer than ``champion_boots`` trusted boots
        (every comparison shares its error: a one-boot champion makes every verdict noisier),
        and — the drift sentinel — every N decided experiments or when its last measurement is
        older than T. One re-measurement at most: it resets the count of decided experiments."""
        if self._champion_due(self.profile.verdict):
            self._remeasure_champion(rnd)

    def _champion_due(self, spec: VerdictSpec) -> bool:
        champion = self.ledger.champion(self.cluster)
        if champion is None:
            return False
        boots = [b for b in self.ledger.boots(champion.experiment_id) if b.status == "down"]
        if not boots:
            return False
        last = boots[-1]
        since = sum(
            1
            for e in self.ledger.experiments(cluster=self.cluster)
            if e.kind == "candidate"
            and e.status not in (None, "vetoed")
            and e.decided_at is not None
            and e.decided_at > (last.ended_at or last.started_at)
        )
        old = (
            spec.drift_max_age_s is not None
            and (datetime.now(UTC) - (last.ended_at or last.started_at)).total_seconds()
            > spec.drift_max_age_s
        )
        trusted = [m for m in self._champion_measurements() if self._trusted(m)]
        few = len(trusted) < spec.champion_boots
        return (few and since >= 1) or since >= spec.drift_every or old

    # ---- verdicts ---------------------------------------------------------------------------
    def _assess(self, e: ExperimentRecord, measurements: list[Measurement]) -> Assessment:
        champion = self._champion_measurements()
        return assess(
            self.profile.verdict,
            Evidence(
                candidate=[objective(m.cells) for m in measurements],
                champion=[objective(m.cells) for m in champion],
                confirmations=sum(1 for m in measurements if m.role == "confirm"),
                candidate_cells=[c for m in measurements for c in m.cells],
                champion_cells=champion[-1].cells,
                min_matmul_rate=self.profile.gates.min_matmul_rate,
            ),
            self.noise(),
            self._effect_prior(e),
        )

    def _effect_prior(self, e: ExperimentRecord) -> EffectPrior | None:
        """The declared effect prior of the knob the experiment changed (``None``: the
        profile's; also for a knob the profile no longer has)."""
        space = self.profile.space
        if e.knob is None or e.knob not in space.names:
            return None
        return space.spec(e.knob).effect_prior

    def _restore_champion(self) -> None:
        """Boot the champion again after a candidate failed, when the profile asks for it."""
        champion = self.ledger.champion(self.cluster)
        if not self.profile.restore_champion or champion is None:
            return
        self.display.phase("restoring the champion")
        try:
            self.testbed.restore(champion.config)
        except NodeError as err:
            self.display.note(f"  the champion was not restored: {err.message}")

    def _crash(self, rnd: RoundRecord, e: ExperimentRecord, run_id: str, err: NodeError) -> None:
        verdict = VerdictRecord(
            status="crash",
            rule="boot" if err.failure_class != "bench_failed" else "bench",
            reason=err.message,
            stats={"failure_class": err.failure_class},
        )
        decided = self.ledger.decide(
            e.id,
            verdict=verdict,
            objective=None,
            delta_pct=None,
            accept_len=None,
            failure_class=err.failure_class,
            failure_detail=err.evidence(),
        )
        self.sink.log_texts(run_id, {"failure.txt": err.evidence()})
        self.sink.set_tags(run_id, {"status": "crash", "failure_class": err.failure_class})
        self.sink.finish(run_id, "FAILED")
        self.display.decided(decided, f"{err.failure_class}: {err.message}")
        if e.kind == "candidate":
            self._restore_champion()
        if e.kind == "baseline":
            self.ledger.finish_round(rnd.id, "failed")
            raise BaselineFailed(
                f"the configured champion did not boot ({err.failure_class}): {err.message}"
            )

    def _decide(
        self,
        e: ExperimentRecord,
        run_id: str,
        assessment: Assessment,
        measurements: list[Measurement],
    ) -> None:
        per_boot = [objective(m.cells) for m in measurements]
        cells = [c for m in measurements for c in m.cells]
        value = objective_of(per_boot)
        delta = float(assessment.stats.get("delta_pct", 0.0))  # type: ignore[arg-type]
        verdict = VerdictRecord(
            status=assessment.status,
            rule=assessment.rule,
            reason=assessment.reason,
            stats=dict(assessment.stats),
        )
        decided = self.ledger.decide(
            e.id,
            verdict=verdict,
            objective=value,
            delta_pct=delta,
            accept_len=accept_len(cells),
            promote=verdict.status == "keep",
            failure_class="clocks_stuck" if verdict.rule == "clocks" else None,
        )
        metrics: dict[str, float] = {"objective": value, "delta_pct": delta, "boots": len(per_boot)}
        for name in ("p_gain", "p_worth", "se", "boot_cv"):
            stat = assessment.stats.get(name)
            if isinstance(stat, float):
                metrics[name] = stat
        for cell in measurements[0].cells:
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
        self.display.decided(decided, verdict.reason)


@dataclass
class Measurement:
    """The cells of one measurement of an experiment (one boot, or a boot and its
    continuation after an interruption)."""

    index: int
    role: str
    cells: list[CellResultRecord]
    complete: bool = False
