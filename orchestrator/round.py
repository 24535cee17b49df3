"""The round loop as a persisted state machine.

Each experiment moves approved → deploying → benching → measured → decided, every step
committed to the ledger before the next begins. Running the same command after a kill picks
up the unfinished round where the ledger says it stopped: a cell already recorded is not
measured again, no engine is left running unrecorded, and the round's budget is honoured.

The loop only dispatches. What a proposer sees is ``history``'s; one experiment taken to its
verdict is ``experiment``'s, one boot ``boot``'s; the champion's evidence and noise estimate
are ``champion``'s, its re-measurements ``remeasure``'s; what is booted next and when an
experiment is decided is ``policy``'s (on ``verdict``'s statistics); a failure of the
infrastructure's is ``faults``'s; MLflow is ``runlog``'s.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from agents import ProposalContext, ProposalExhausted, Proposer, proposed_by
from agents.llm_fallback import fallback_line
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
from orchestrator import budget, busy_host, cell_renames, knob_renames, resumes, revision
from orchestrator.approval import ApprovalGate, NobodyDeciding
from orchestrator.baseline import crashed_baseline
from orchestrator.boot import Booter
from orchestrator.champion import ChampionEvidence
from orchestrator.champion_level import CellsChanged, LevelInForce, level_in_force, shown
from orchestrator.closures import CLOSED_BY
from orchestrator.crashpoints import crashpoint
from orchestrator.display import (
    RoundDisplay,
    exhausted,
    kept_on_resume,
    stopped_by_cap,
)
from orchestrator.errors import OrchestrateError
from orchestrator.evolution import outside_domain
from orchestrator.experiment import ExperimentRunner
from orchestrator.faults import InfrastructureFaults
from orchestrator.gpu_hours import gpu_hours
from orchestrator.history import proposal_context
from orchestrator.intake import Intake
from orchestrator.measurements import changed_cells
from orchestrator.mirror import RETRY_S
from orchestrator.profile import Profile
from orchestrator.profile_champion import closed_lines, said_once
from orchestrator.remeasure import ChampionRemeasure
from orchestrator.round_close import owe
from orchestrator.runlog import RunLog
from orchestrator.stops import last_stop, record_cap, record_stop, said_stop
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
        change = None
        if existing is not None:
            # taken up again: recorded, with the boots the run before left open (``resumes``)
            resumes.record(
                self.ledger,
                self.cluster,
                rnd.id,
                proposer=options.proposer,
                approve=options.approve,
                seed=options.seed,
            )
            change = self._profile_change(existing)
            asked = {
                "budget": str(options.budget),
                "proposer": options.proposer,
                "approval": options.approve,
                "seed": str(options.seed),
            }
            stop = last_stop(self.ledger, self.cluster, rnd.id)
            if stop is not None:
                self.display.note(f"  it {said_stop(stop)}")
            for line in kept_on_resume(existing, asked, change):
                self.display.note(line)
            # a baseline left undecided of a champion: edited since: closed as it is taken up
            for line in closed_lines(self.profile, self.ledger, rnd.id):
                self.display.note(line)
            rnd = self._caps_on_resume(rnd, options)
            # what a kill left open in MLflow, from the ledger; an MLflow that answered the
            # command's start but not now (the same outage as the ledger's, which this resume
            # waited out) is filled in later, as one that went away mid-round
            self.runlog.mirror.write(lambda: self.runlog.reconcile(rnd))
            self.remeasures.settle()
        if change is None:  # a new round, or one resumed under the profile it started under
            for line in self._changed_since_last_run():
                self.display.note(line)
        # the profile gained or lost a knob since the champion was recorded (``evolution``),
        # and the profile recorded (``revision``)
        revised = self.champion.revised()  # before the profile is recorded: what it changed
        # champion: edited while the ledger has a champion: not used, said once
        ignored = said_once(self.profile, self.ledger, self.champion.fitted())
        if ignored is not None:
            self.display.note(ignored)
        for line in self.champion.record_knob_changes():
            self.display.note(line)
        champion = self.champion.fitted()
        if champion is not None:  # a domain narrowed under it: kept, and said (``evolution``)
            for line in outside_domain(self.profile.space, champion.config).values():
                self.display.note(line)
        for line in self._renamed:
            self.display.note(line)
        # a cell redefined since it was measured is measured again (``measurements.counts``)
        for line in changed_cells(self.ledger, self.cluster, self.profile.cells).values():
            self.display.note(line)
        # a knob's flag dropped or gained: measured again under it (``rendering``)
        restated = self.champion.restated(revised)
        if restated is not None:
            self.display.note(restated)
        self.champion.realign()  # a knob put back as it was: its earlier level in force again
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

    def _profile_change(self, rnd: RoundRecord) -> str | None:
        """What the profile changed since ``rnd`` started (``revision.said``); ``None``:
        nothing (but what an upgrade alone changes)."""
        if rnd.profile_digest == self.profile.digest:
            return None
        then = revision.recorded(self.ledger, self.cluster, rnd.profile_digest)
        now = revision.Revision.of(self.profile)
        return revision.said(then, now, (rnd.profile_name, rnd.profile_digest))

    def _changed_since_last_run(self) -> list[str]:
        """A round under a profile other than the one the cluster last ran under (a round's, or
        ``cluster up``'s): what changed, in one line."""
        last = revision.last(self.ledger, self.cluster)
        if last is None or last.digest == self.profile.digest:
            return []
        now = revision.Revision.of(self.profile)
        said = revision.said(last, now, (last.name, last.digest))
        return (
            [] if said is None else [f"  the profile changed since {self.cluster} last ran {said}"]
        )

    def _caps_on_resume(self, rnd: RoundRecord, options: RoundOptions) -> RoundRecord:
        """A resume keeps the round's caps unless this command gives one, each said in one
        line: the wall-clock cap counts from this command's start, the GPU-hours cap over the
        whole round (every boot since it started)."""
        used = gpu_hours(self.ledger, rnd, self.profile)
        caps = (
            ("--max-hours", rnd.max_hours, options.max_hours, "counted from now"),
            ("--max-gpu-hours", rnd.max_gpu_hours, options.max_gpu_hours, f"{used:.2f} used"),
        )
        for flag, kept, asked, how in caps:
            if asked is None:
                if kept is not None:
                    self.display.note(f"  round {rnd.id} keeps its {flag} {kept:g}, {how}")
                continue
            if asked != kept:
                had = "none" if kept is None else f"{kept:g}"
                self.display.note(f"  round {rnd.id} takes {flag} {asked:g}, {how} (it had {had})")
                if flag == "--max-hours":
                    self.ledger.set_round_max_hours(rnd.id, asked)
                else:
                    self.ledger.set_round_max_gpu_hours(rnd.id, asked)
        return self.ledger.round(rnd.id)

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
                experiment = self._next_experiment(rnd)
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
        """What the proposer sees now, built from the ledger."""
        return proposal_context(
            self.profile, self.ledger, self.champion, rnd, self._candidates_done(rnd)
        )

    def _next_experiment(self, rnd: RoundRecord) -> ExperimentRecord | None:
        """Propose, record, pass the veto gate; the experiment to run, or None if vetoed."""
        index = self._candidates_done(rnd) + 1
        pending = [p for p in self.ledger.proposals(round_id=rnd.id, status=ProposalStatus.PENDING)]
        if pending:  # proposed before (a round stopped while it waited): nobody proposes now
            record = pending[0]
            self.display.experiment(index, rnd.budget, "from the queue")
            self.display.phase(f"proposal #{record.id} from the queue, proposed by {record.source}")
        else:
            self.display.experiment(index, rnd.budget, "proposing")
            context = self.context(rnd)
            # who really proposes: an LLM proposer's fallback while its API cools off
            self.display.phase(f"proposing ({proposed_by(self.proposer, context)})")
            proposal = self.proposer.propose(context)
            record = self.intake.record(rnd, proposal)
            crashpoint("proposal.recorded")
        self.display.experiment(index, rnd.budget, record.change.describe())
        fell_back = fallback_line(record.source, record.notes)
        if fell_back is not None:  # the LLM did not steer this one: said, with why
            self.display.note(f"  {fell_back}")
        why = self.intake.closure(record)
        if why is not None and record.status == ProposalStatus.PENDING:
            # a change the profile can no longer run (a knob lost, a domain narrowed since:
            # ``evolution``): nobody is asked to approve it; closed by the profile, barring
            # nothing
            closed = self.ledger.decide_proposal(
                record.id, status=ProposalStatus.VETOED, by=CLOSED_BY, reason=why.reason
            )
            self.intake.veto(rnd, closed)
            return None
        # the gate's mode: a resume's ``--approve`` runs it, whatever the round started with
        self.display.phase(f"waiting for approval ({self.gate.mode})")
        try:
            decision = self.gate.decide(record, self.context(rnd))
        except NobodyDeciding as paused:
            # the timeout's veto is committed: its experiment row before the round stops
            # (results.tsv, MLflow and known-bad have it, not only after a resume)
            self.intake.veto(rnd, paused.decided)
            raise
        crashpoint("proposal.approved")
        if decision.status == ProposalStatus.VETOED:
            self.intake.veto(rnd, decision)
            return None
        return self.intake.experiment(rnd, decision)

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
