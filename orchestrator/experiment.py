"""One experiment's verdict loop: boot and measure until the verdict is final, doing what
``policy`` asks next (the candidate's boots, the champion's, a crash, the decision), every boot
and cell committed; an infrastructure failure is ``faults``'s. ``round`` runs it for each
experiment of a round (and again for one a kill left undecided)."""

from __future__ import annotations

from collections.abc import Sequence

from cluster.errors import NodeError
from knobs.vocabulary import INFRASTRUCTURE, BootStatus, Kind, State, Status
from ledger import BootRecord, ExperimentRecord, Ledger, RoundRecord, VerdictRecord
from orchestrator import policy
from orchestrator.baseline import baseline_failed
from orchestrator.boot import Booter
from orchestrator.busy_host import looks_at
from orchestrator.champion import ChampionEvidence
from orchestrator.closures import Closure, close, closure_of
from orchestrator.crashpoints import crashpoint
from orchestrator.display import RoundDisplay, describe
from orchestrator.errors import OrchestrateError
from orchestrator.evolution import Lineage, fit
from orchestrator.faults import InfrastructureFaults
from orchestrator.history import monotone_classes
from orchestrator.host_stalls import busy_words
from orchestrator.measurements import BootCount, Measurement
from orchestrator.profile import Profile
from orchestrator.profile_champion import stale_baseline
from orchestrator.remeasure import ChampionRemeasure
from orchestrator.rendering import digests, rendered_as
from orchestrator.runlog import RunLog
from orchestrator.verdict import Assessment, accept_len, objective, objective_of


class GreedyUncheckable(OrchestrateError):
    """``verdict.check_greedy`` is on, and the champion reproduced none of its own greedy
    texts: no change can be checked, and every verdict would be ``greedy-unchecked``. The
    experiment waits undecided, its boots kept, for the profile to say otherwise."""

    exit_code = 3

    def __init__(self, message: str, texts: list[tuple[str, str]], measurements: int) -> None:
        super().__init__(message)
        self.texts = texts
        self.measurements = measurements


class ExperimentRunner:
    """Takes one experiment to its verdict (``run``), from whatever the ledger holds of it."""

    def __init__(
        self,
        profile: Profile,
        ledger: Ledger,
        champion: ChampionEvidence,
        booter: Booter,
        remeasures: ChampionRemeasure,
        faults: InfrastructureFaults,
        runlog: RunLog,
        display: RoundDisplay,
    ) -> None:
        self.profile = profile
        self.ledger = ledger
        self.champion = champion
        self.booter = booter
        self.remeasures = remeasures
        self.faults = faults
        self.runlog = runlog
        self.display = display

    def run(self, rnd: RoundRecord, e: ExperimentRecord, index: int) -> None:
        """Boot and measure ``e`` (the round's ``index``-th change; 0: the baseline) until
        its verdict is final, doing what ``policy`` asks next; every boot and cell is
        committed.

        Raises:
            BaselineFailed: ``e`` is the baseline, and it crashed: the profile's champion does
                not boot as configured (``baseline``; the round stays open, exit 3).
            GreedyUncheckable: ``e`` is a change, the greedy check is on and the champion's
                own texts differ between its runs in every cell.
            InfrastructureFault: a node stayed away, its clocks stayed off, or the champion
                stopped booting.
            RefitChampionFailing: the champion stopped booting as the profile renders it now
                (a knob lost or gained since it was measured).
        """
        self.display.experiment(index, rnd.budget, describe(e))
        run_id = self.runlog.experiment_run(rnd, e)
        failure: NodeError | None = None
        while True:
            e = self.ledger.experiment(e.id)
            if e.state == State.DECIDED:
                return
            # a change the profile can no longer run (``evolution``), a baseline of a
            # champion: edited since (``profile_champion``)
            why = closure_of(self.profile.space, self.ledger, e) or stale_baseline(
                self.profile, self.ledger, e
            )
            if why is not None:
                self._close(e, run_id, why)
                return
            if e.kind == Kind.CANDIDATE:
                self._greedy_checkable(e)  # or stop the round: exit 3
            action = self._next_action(e)
            if action.phase is not None:
                self.display.phase(action.phase)
            if isinstance(action, policy.Decide):
                self._decide(e, run_id, action.assessment, action.measurements)
                return
            if isinstance(action, policy.Crash):
                self._crash(rnd, e, run_id, action.assessment, failure)
                return
            if isinstance(action, policy.BootChampion):
                failure = self.remeasures.remeasure(rnd)
                if failure is None:
                    self.faults.clocks_checked(rnd, e)  # or stop the round: exit 5
                else:
                    champion = self.ledger.experiment(self.champion.current().experiment_id)
                    if failure.failure_class in INFRASTRUCTURE:
                        self.faults.wait_or_stop(e, failure, booted=champion)  # or exit 5
                    else:  # booted once more, or the round stops: exit 5
                        self.faults.champion_failed(e, failure, champion=champion)
                continue
            if action.note is not None:
                self.display.note(action.note)
            failure = self.booter.measure(
                e, run_id, role=action.role, measurement=action.measurement
            )
            if failure is None:
                self.faults.clocks_checked(rnd, e)  # or stop the round: exit 5
            elif failure.failure_class in INFRASTRUCTURE:
                self.faults.wait_or_stop(e, failure)  # or stop the round: exit 5
            # a failure of the config's: the policy says whether it counts (a crash) or the
            # config is booted once more

    def _close(self, e: ExperimentRecord, run_id: str | None, why: Closure) -> None:
        """Change ``e`` moves a knob the profile lost since it was recorded, or to a value
        outside the domain it narrowed since (``why``): closed without a boot more
        (``closures.close``), with the line."""
        closed = close(self.ledger, e, why)
        crashpoint("verdict.committed")
        verdict = self.ledger.verdict(e.id)
        reason = "" if verdict is None else verdict.reason
        self.runlog.vetoed(run_id, closed, reason)
        crashpoint("mlflow.verdict")
        # the line names the change as proposed; results.tsv's description says why too
        self.display.decided(closed.model_copy(update={"description": e.description}), reason)

    def _greedy_checkable(self, e: ExperimentRecord) -> None:
        """Stop the round before change ``e`` boots or is judged when the greedy check could
        check nothing: the champion's own texts differ between its runs in every cell (an
        engine whose texts depend on the batch, docs/real-gpu.md). Every verdict would be
        ``greedy-unchecked``, a night of boots decided nothing; the person says whether the
        check goes (``verdict.check_greedy: false``) and the same command resumes ``e``."""
        if not self.profile.verdict.check_greedy:
            return
        texts, measurements = self.champion.irreproducible_texts()
        if not texts:
            return
        cell, prompt = texts[0]
        raise GreedyUncheckable(
            f"the champion's own greedy texts differ between its runs in every cell "
            f"({len(texts)} prompt(s) over {measurements} measurement(s), e.g. {prompt} in "
            f"cell {cell}): this engine's texts depend on more than the config, so the greedy "
            "check can check no change and every verdict would be inconclusive; set "
            f"verdict.check_greedy: false in profile {self.profile.name} (or make the engine "
            f"deterministic) and run the same command again to resume experiment #{e.id}",
            texts,
            measurements,
        )

    def _next_action(self, e: ExperimentRecord) -> policy.Action:
        """``policy``'s next step for ``e``, from the ledger's evidence."""
        baseline = e.kind == Kind.BASELINE
        failed, last_failed = self._config_failures(e)
        # as booted: fitted to the profile (``evolution``), for the knobs' monotone bounds
        fitted = e.model_copy(update={"config": fit(self.profile.space, self.ledger, e).config})
        # a measurement of launchers the profile no longer renders so (a knob's flag dropped
        # between a kill and its resume) is set aside: the next boot starts a new one
        now = digests(self.profile, fitted.config, self.champion.orders())
        measurements = [m for m in self.champion.measurements(e.id) if rendered_as(m, now)]
        progress = policy.Progress(
            baseline=baseline,
            measurements=measurements,
            min_matmul_rate=self.profile.gates.min_matmul_rate,
            champion_boots_during=0 if baseline else self.champion.boots_during(e.id),
            champion_measured_after=baseline or self.champion.measured_after(e.id),
            failed_boots=failed,
            last_failed=last_failed,
            monotone=monotone_classes(self.profile, fitted),
            champion_level=baseline or bool(self.champion.level()),
        )
        return policy.next_action(
            self.profile.verdict, progress, lambda ms: self.champion.judge(e, ms)
        )

    def _config_failures(self, e: ExperimentRecord) -> tuple[list[policy.BootFailure], bool]:
        """``e``'s boots that failed for the config's reasons and count
        (``policy.counted_failures``: not those before the champion failed too), from the
        ledger (a resume counts those before the kill), and whether its last boot is one."""
        boots = self.ledger.boots(e.id)
        theirs = (
            self.ledger.boots(self.champion.current().experiment_id)
            if e.kind == Kind.CANDIDATE
            else []
        )
        counted = set(
            policy.counted_failures(
                [b.id for b in boots if _config_failed(b)],
                [b.id for b in theirs if _config_failed(b)],
                [b.id for b in theirs if b.status != BootStatus.FAILED],
            )
        )
        config = [b for b in boots if b.id in counted]
        failed = [policy.BootFailure(str(b.failure_class), b.failure_detail or "") for b in config]
        return failed, bool(config) and config[-1] is boots[-1]

    def _crash(
        self,
        rnd: RoundRecord,
        e: ExperimentRecord,
        run_id: str | None,
        crash: Assessment,
        err: NodeError | None,
    ) -> None:
        if err is None:  # resumed: the failure as the ledger has it
            boot = self.ledger.boots(e.id)[-1]
            err = NodeError(boot.failure_detail or "", failure_class=boot.failure_class or "start")
        verdict = VerdictRecord(
            status=crash.status, rule=crash.rule, reason=crash.reason, stats=crash.stats
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
        crashpoint("verdict.committed")
        self.runlog.crashed(run_id, decided, err)
        crashpoint("mlflow.verdict")
        boots = BootCount.of(decided, self.ledger.boots(e.id), verdict)
        self.display.decided(decided, f"{err.failure_class}: {crash.reason}", boots)
        if e.kind == Kind.CANDIDATE:
            self.booter.restore(self.champion.config())
        if e.kind == Kind.BASELINE:
            # the profile's to fix: the round stays open (its stop recorded as it unwinds), for
            # the same command to resume with the champion as the profile says it then
            raise baseline_failed(self.profile, e, rnd.id, str(err.failure_class), crash.reason)

    def _decide(
        self,
        e: ExperimentRecord,
        run_id: str | None,
        assessment: Assessment,
        measurements: Sequence[Measurement],
    ) -> None:
        per_boot = [objective(m.cells) for m in measurements]
        cells = [c for m in measurements for c in m.cells]
        # nothing measured (a verdict reached without a boot of its own that came up)
        value = objective_of(per_boot) if per_boot else None
        delta = float(assessment.stats.get("delta_pct", 0.0))  # type: ignore[arg-type]
        discarded_by = assessment.rule if assessment.status == Status.DISCARD else None
        busy = busy_words([m.cells for m in measurements], discarded_by)
        # left undecided on a busy host's readings alone: no look at the value, so open for
        # none (``busy_host.held``: held for this sitting, then proposed afresh)
        undecided = busy is not None and assessment.status == Status.INCONCLUSIVE
        opened = None if undecided else self._open_for(e, assessment)
        verdict = VerdictRecord(
            # open for another look: nothing concluded of it, whatever rule stopped it
            # (``policy.open_for``)
            status=assessment.status if opened is None else Status.INCONCLUSIVE,
            rule=assessment.rule,
            reason=assessment.reason if opened is None else f"{assessment.reason}; {opened}",
            stats=dict(assessment.stats),
        )
        decided = self.ledger.decide(
            e.id,
            verdict=verdict,
            objective=value,
            delta_pct=delta,
            accept_len=accept_len(cells),
            promote=verdict.status == Status.KEEP,
            failure_class="clocks_stuck" if verdict.rule == "clocks" else None,
            description=self._description(e, assessment, busy, opened),
        )
        crashpoint("verdict.committed")
        if verdict.status == Status.KEEP:
            crashpoint("champion.promoted")
        first = measurements[0].cells if measurements else []
        boots = BootCount.of(decided, self.ledger.boots(e.id), verdict)
        self.runlog.decided(run_id, decided, verdict, (value or 0.0, delta), first, cells, boots)
        crashpoint("mlflow.verdict")
        # its description says what look it is open for: the line says it once
        self.display.decided(decided, assessment.reason, boots)

    @staticmethod
    def _description(
        e: ExperimentRecord, assessment: Assessment, busy: str | None, opened: str | None
    ) -> str | None:
        """The record's description where the verdict adds to it (``None``: as proposed): what
        look the change is open for, and that a busy host disturbed every boot of a change it
        left undecided or discarded (``busy``: ``host_stalls.busy_words``)."""
        said = [] if opened is None else [f"stopped for want of boots, {opened}"]
        if busy is not None and assessment.status in (Status.DISCARD, Status.INCONCLUSIVE):
            said.append(busy)
        return "; ".join([describe(e), *said]) if said else None

    def _open_for(self, e: ExperimentRecord, assessment: Assessment) -> str | None:
        """What a change the verdict stops for want of boots is open for, in its record's
        words (``policy.open_for``: a second look, or a further one), or ``None``: the verdict
        settles it under this champion. Its looks are the ledger's, this one included, less
        those a busy host left undecided (``busy_host.looks_at``)."""
        if e.kind != Kind.CANDIDATE or e.knob is None or e.champion_key is None:
            return None
        if assessment.status not in (Status.DISCARD, Status.INCONCLUSIVE):
            return None
        # a look a busy host left undecided measured the host: no look at the value
        # its own keys fitted too: a change resumed across a knob's rename ran under the old name
        lineage = Lineage.lazy(self.profile.space, self.ledger, self.champion.cluster)
        keys = lineage.fit(e).config.key, lineage.champion_key(e)
        earlier = [i for i in looks_at(self.profile, self.ledger, *keys) if i != e.id]
        looks = len(earlier) + 1
        return policy.open_for(self.profile.verdict, assessment.rule, assessment.stats, looks)


def _config_failed(boot: BootRecord) -> bool:
    """Whether ``boot`` failed for what would be its config's reasons."""
    return boot.status == BootStatus.FAILED and boot.failure_class not in INFRASTRUCTURE
