"""The round loop as a persisted state machine.

Each experiment moves approved → deploying → benching → measured → decided, every step
committed to the ledger before the next begins. Running the same command after a kill picks
up the unfinished round where the ledger says it stopped: a cell already recorded is not
measured again, no engine is left running unrecorded, and the round's budget is honoured.

The loop only dispatches. What a round says and settles as it starts or resumes is
``round_opening``'s; its next proposal through the veto gate ``round_proposal``'s, on what
the proposer sees (``history``'s); one experiment taken to its verdict is ``experiment``'s,
one boot ``boot``'s; the champion's evidence and noise estimate are ``champion``'s, its
re-measurements ``remeasure``'s; what is booted next and when an experiment is decided is
``policy``'s (on ``verdict``'s statistics); a failure of the infrastructure's is
``faults``'s; MLflow is ``runlog``'s.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from agents import ProposalContext, ProposalExhausted, Proposer
from knobs.vocabulary import (
    INFRASTRUCTURE,
    Kind,
    ProposalStatus,
    RoundStatus,
    State,
)
from ledger import (
    ChampionRecord,
    ExperimentRecord,
    Ledger,
    RoundRecord,
)
from orchestrator import budget, busy_host, cell_renames, knob_renames
from orchestrator.approval import ApprovalGate
from orchestrator.baseline import crashed_baseline
from orchestrator.boot import Booter
from orchestrator.champion import ChampionEvidence
from orchestrator.champion_level import CellsChanged, LevelInForce, level_in_force, shown
from orchestrator.crashpoints import crashpoint
from orchestrator.display import (
    RoundDisplay,
    exhausted,
    stopped_by_cap,
)
from orchestrator.errors import OrchestrateError
from orchestrator.experiment import ExperimentRunner
from orchestrator.faults import InfrastructureFaults
from orchestrator.gpu_hours import gpu_hours
from orchestrator.intake import Intake
from orchestrator.mirror import RETRY_S
from orchestrator.profile import Profile
from orchestrator.remeasure import ChampionRemeasure
from orchestrator.round_close import owe
from orchestrator.round_opening import RoundOpening
from orchestrator.round_proposal import ProposalStep
from orchestrator.runlog import RunLog
from orchestrator.stops import record_cap, record_stop
from orchestrator.testbed import Sink, Testbed


@dataclass(frozen=True)
class RoundOptions:
    """What ``orchestrate round`` was asked for."""

    budget: int
    proposer: str
    approve: str
    max_hours: float | None = None
    max_gpu_hours: float | None = None
    seed: int = 0


#: What stops a round with its experiments left (it stays open; a resume goes on).
CAPS = ("max-hours", "max-gpu-hours")


@dataclass(frozen=True)
class RoundReport:
    """What a round did."""

    round: RoundRecord
    experiments: list[ExperimentRecord]
    champion: ChampionRecord | None
    resumed: bool
    stopped_by: str
    #: the round's GPU-hours (every boot's wall time × the cluster's GPUs)
    gpu_hours: float = 0.0
    #: the champion's level in force where it is not what its row records (measured again)
    level: LevelInForce | None = None
    #: the cells the profile removed or added since the champion was measured
    cells: CellsChanged | None = None


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
        sleep: Callable[[float], None] = time.sleep,
        guard: Callable[[], None] | None = None,
        mlflow_retry_s: float = RETRY_S,
        owes_close: bool = False,
    ) -> None:
        # a cell renamed: its readings carry over (``cell_renames``; said as the round starts)
        cell_renames.check(profile, ledger)
        # a knob renamed: its value and history carry over; one renamed unsaid is refused
        knob_renames.check(profile, ledger)
        profile, self._renamed = cell_renames.resolved(profile, ledger)
        self.profile = profile
        self.ledger = ledger
        self.proposer = proposer
        self.gate = gate
        self.display = display
        self.cluster = profile.cluster.name
        #: the round ``run`` started or resumed, once it has (what a command that stopped
        #: short writes the report of)
        self.round_id: int | None = None
        self._clock = clock
        #: the caller writes the round's close to MLflow after ``run`` (``round_close``)
        self._owes_close = owes_close
        self.runlog = RunLog(ledger, sink, note=display.note, clock=clock, retry_s=mlflow_retry_s)
        # guard: the safe point before each boot (the lease and the node claims, issue #17)
        self.booter = Booter(profile, ledger, testbed, self.runlog, display, guard=guard)
        self.champion = ChampionEvidence(profile, ledger)
        self.remeasures = ChampionRemeasure(self.champion, self.booter, self.runlog, display)
        self.intake = Intake(profile, ledger, self.champion, self.runlog, display)
        self.faults = InfrastructureFaults(profile, ledger, display, sleep)
        self.experiments = ExperimentRunner(
            profile,
            ledger,
            self.champion,
            self.booter,
            self.remeasures,
            self.faults,
            self.runlog,
            display,
        )
        self.opening = RoundOpening(
            profile, ledger, self.champion, self.runlog, self.remeasures, display, self._renamed
        )
        self.proposals = ProposalStep(
            profile, ledger, self.champion, proposer, gate, self.intake, display
        )

    # ---- the loop ---------------------------------------------------------------------------
    def run(self, options: RoundOptions) -> RoundReport:
        """Run the round to its budget.

        Raises:
            BaselineFailed: no champion exists and the configured one crashed (exit 3; the
                round stays open, recorded the same way, for the profile to be fixed).
            InfrastructureFault: a node stayed away, or the champion stopped booting (the
                round stays open for the same command; why is recorded, ``round-stopped``).
            BusyHost: changes in a row measured a busy host (exit 5; recorded the same way).
            RefitChampionFailing: the champion stopped booting as the profile renders it now,
                which lost or gained a knob of its config (exit 3; recorded the same way).
            LedgerError, MlflowSinkError: the ledger or MLflow failed.
        """
        started = self._clock()
        existing = self.ledger.unfinished_round(self.cluster)
        rnd = existing or self.ledger.create_round(
            cluster=self.cluster,
            profile_name=self.profile.name,
            profile_digest=self.profile.digest,
            budget=options.budget,
            proposer=options.proposer,
            approve=options.approve,
            seed=options.seed,
            max_hours=options.max_hours,
            max_gpu_hours=options.max_gpu_hours,
        )
        self.round_id = rnd.id
        rnd = self.runlog.round_run(rnd)
        crashpoint("round.started")
        verb = "resuming" if existing is not None else "starting"
        self.display.start(
            f"{verb} round {rnd.id} on {self.cluster} ({self.profile.name}): "
            f"{self._candidates_done(rnd)} of {rnd.budget} experiments done, "
            f"proposer {options.proposer}, approve {options.approve}"
        )
        rnd = self.opening.open(rnd, existing, options)
        try:
            stopped_by = self._loop(rnd, started)
        except (OrchestrateError, KeyboardInterrupt) as err:
            record_stop(self.ledger, self.cluster, rnd.id, err)
            raise
        finally:
            self.display.stop()
        used = gpu_hours(self.ledger, rnd, self.profile)
        if stopped_by not in CAPS:
            # MLflow complete before the ledger closes the round: a kill in between resumes it
            self.runlog.complete_round(rnd)
            crashpoint("round.finished")
            if self._owes_close:  # till written: a kill as it is leaves it for the next command
                owe(self.ledger, self.cluster, rnd.id)
            self.ledger.finish_round(rnd.id, RoundStatus.DONE)
        else:
            line = stopped_by_cap(rnd, stopped_by, self._candidates_done(rnd), used)
            record_cap(self.ledger, self.cluster, rnd.id, stopped_by, line)
            self.display.note(line)
        champion, cells = shown(self.champion)  # its objective over the cells of now
        return RoundReport(
            round=self.ledger.round(rnd.id),
            experiments=self.ledger.experiments(round_id=rnd.id),
            champion=champion,
            resumed=existing is not None,
            stopped_by=stopped_by,
            gpu_hours=used,
            level=level_in_force(self.champion),
            cells=cells,
        )

    def _loop(self, rnd: RoundRecord, started: float) -> str:
        """Finish what a killed run left, then experiment to the budget; what stopped it."""
        self.booter.stop_stale(self.cluster)
        for e in self.ledger.experiments(round_id=rnd.id):
            if e.state != State.DECIDED:
                self._run_experiment(rnd, e)
        self._adopt_approved_proposals(rnd)
        if self.ledger.champion(self.cluster) is None:
            self._baseline(rnd)
        stopped_by = "budget"
        while self._candidates_done(rnd) < rnd.budget:
            capped = self._capped(rnd, started)
            if capped is not None:
                return capped
            # changes in a row that measured a busy host: stop, not the next (exit 5)
            head = self.profile.cluster.head
            busy_host.check(
                self.ledger,
                rnd,
                self.profile.cells,
                self.profile.verdict.busy_host_stop,
                engine=head.name,
                at=head.host,
            )
            if self.remeasures.due():
                failure = self.remeasures.remeasure(rnd)
                if failure is not None and failure.failure_class not in INFRASTRUCTURE:
                    champion = self.ledger.experiment(self.champion.current().experiment_id)
                    self.faults.champion_failed(None, failure, champion=champion)
                    continue  # booted once more while due, before any change boots on it
            try:
                experiment = self.proposals.next_experiment(rnd)
            except ProposalExhausted as e:
                done = self._candidates_done(rnd)
                self.display.note(exhausted(rnd, done, str(e), e.left, e.refusals))
                stopped_by = "exhausted"
                break
            if experiment is not None:
                self._run_experiment(rnd, experiment)
        self._test_last_keep(rnd, started)
        return stopped_by

    def _capped(self, rnd: RoundRecord, started: float) -> str | None:
        """The cap the round has reached (``CAPS``), if any."""
        if rnd.max_hours is not None and self._clock() - started > rnd.max_hours * 3600:
            return "max-hours"
        cap = rnd.max_gpu_hours
        if cap is not None and gpu_hours(self.ledger, rnd, self.profile) >= cap:
            return "max-gpu-hours"
        return None

    def _test_last_keep(self, rnd: RoundRecord, started: float) -> None:
        """A round that ends on a keep boots the new champion once on its own before it closes
        (``policy.keep_test_due``), as the next proposal would have: the boots that kept it were
        chosen for reading high, and the level a person finds in the morning (and the next
        round judges against) is tested on a boot of its own, or set aside and measured afresh.
        Not past a cap, and a boot that fails here: the next round's first re-measurement
        tests it then."""
        if not self.remeasures.keep_untested():
            return
        capped = self._capped(rnd, started)
        if capped is not None:
            self.display.note(
                f"the round's last keep is not yet booted on its own ({capped} reached): the "
                "next round does it first"
            )
            return
        self.display.note("the round's last keep is booted on its own before the round ends")
        self.remeasures.remeasure(rnd)

    def _candidates_done(self, rnd: RoundRecord) -> int:
        return budget.done(self.ledger.experiments(round_id=rnd.id))

    def _adopt_approved_proposals(self, rnd: RoundRecord) -> None:
        """An approved proposal whose experiment was never recorded (a kill in between)."""
        used = {e.proposal_id for e in self.ledger.experiments(round_id=rnd.id)}
        for p in self.ledger.proposals(round_id=rnd.id):
            if p.id in used:
                continue
            if p.status == ProposalStatus.APPROVED:
                self._run_experiment(rnd, self.intake.experiment(rnd, p))
            elif p.status == ProposalStatus.VETOED:
                self.intake.veto(rnd, p)

    # ---- proposals --------------------------------------------------------------------------
    def context(self, rnd: RoundRecord) -> ProposalContext:
        """What the proposer sees now, built from the ledger (``ProposalStep.context``)."""
        return self.proposals.context(rnd)

    # ---- experiments ------------------------------------------------------------------------
    def _baseline(self, rnd: RoundRecord) -> None:
        config = self.profile.initial_champion()
        crashed = crashed_baseline(self.ledger, self.cluster)
        if crashed is not None:  # the profile's to fix (``baseline``): said, then booted
            same = crashed.config.key == config.key
            self.display.note(
                f"  the champion as configured did not boot in experiment #{crashed.id} "
                f"({crashed.failure_class}): "
                + (
                    "champion: says the same, so it is booted again"
                    if same
                    else "champion: changed since, so the new one is measured"
                )
            )
        e = self.ledger.add_experiment(
            cluster=self.cluster,
            round_id=rnd.id,
            kind=Kind.BASELINE,
            config=config,
            champion_key=None,
            champion_objective=None,
            description="baseline",
        )
        self._run_experiment(rnd, e)

    def _run_experiment(self, rnd: RoundRecord, e: ExperimentRecord) -> None:
        """``e`` to its verdict (``ExperimentRunner.run``)."""
        index = self._candidates_done(rnd) + 1 if e.kind == Kind.CANDIDATE else 0
        self.experiments.run(rnd, e, index)
