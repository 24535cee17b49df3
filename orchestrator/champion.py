"""The champion's evidence: its trusted boots, the cluster's noise estimate, its re-measurements
and drift.

Every verdict compares a candidate with the champion, so the champion's level is measured on
several boots (topped up after each keep) and again every so often (the drift sentinel); a
re-measurement that flags a drift is followed by one more boot, and only a drift that boot
confirms re-bases the level on the boots from the flag on (an unconfirmed flag's boots stay in
the level). The noise estimate — how much one boot's objective scatters on this cluster — is
the profile's prior pooled with every config the ledger measured on several boots. When to
re-measure and what counts as a drift is ``policy``'s to say; this module reads the ledger and
boots.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import UTC, datetime

from agents import ChampionCell
from cluster.errors import NodeError
from knobs.config import Config
from knobs.records import CellResultRecord
from knobs.vocabulary import BootRole, BootStatus, Kind, State, Status
from ledger import ChampionRecord, ExperimentRecord, Ledger, RoundRecord
from orchestrator import policy
from orchestrator.boot import Booter
from orchestrator.crashpoints import crashpoint
from orchestrator.display import RoundDisplay
from orchestrator.evolution import fit_champion, knob_changes
from orchestrator.measurements import Measurement, read_measurements
from orchestrator.noise import NoiseModel, learn
from orchestrator.pooling import ValueBoots, pool
from orchestrator.priors import base_prior, learned_prior
from orchestrator.profile import Profile
from orchestrator.runlog import RunLog
from orchestrator.verdict import (
    Assessment,
    Evidence,
    assess,
    objective,
    objective_of,
    slow_ranks,
)


class ChampionEvidence:
    """What the ledger knows of a cluster's champion and its noise; re-measures it."""

    def __init__(
        self,
        profile: Profile,
        ledger: Ledger,
        booter: Booter,
        runlog: RunLog,
        display: RoundDisplay,
    ) -> None:
        self.profile = profile
        self.ledger = ledger
        self.booter = booter
        self.runlog = runlog
        self.display = display
        self.cluster = profile.cluster.name

    # ---- reading the ledger -----------------------------------------------------------------
    def fitted(self) -> ChampionRecord | None:
        """The champion, if there is one, its config fitted to the profile's knob space (a
        knob the profile gained at its default, one it lost dropped: ``evolution``)."""
        champion = self.ledger.champion(self.cluster)
        return None if champion is None else fit_champion(self.profile.space, champion)

    def current(self) -> ChampionRecord:
        """The champion, fitted (a round has one once its baseline is decided)."""
        champion = self.fitted()
        assert champion is not None
        return champion

    def config(self) -> Config | None:
        """The champion's fitted config, if there is a champion."""
        champion = self.fitted()
        return champion.config if champion is not None else None

    def record_knob_changes(self) -> list[str]:
        """The lines saying what fitting the champion to the profile changed, each recorded
        in the ledger the first time it is seen (``evolution.knob_changes``)."""
        return knob_changes(self.profile.space, self.ledger, self.cluster, record=True)

    def measurements(self, experiment_id: int) -> list[Measurement]:
        """Any experiment's measurements, complete when they have every cell of the profile."""
        return read_measurements(self.ledger, experiment_id, [c.name for c in self.profile.cells])

    def trusted(self, m: Measurement) -> bool:
        """Complete, and every node's clocks were right."""
        return m.trusted(self.profile.gates.min_matmul_rate)

    def level(self) -> list[Measurement]:
        """The champion's complete measurements with every node's clocks right, since its last
        significant drift."""
        champion = self.current()
        complete = [m for m in self.measurements(champion.experiment_id) if m.complete]
        # a baseline measured only with a node's clocks off is all there is until re-measured
        measurements = [m for m in complete if self.trusted(m)] or complete
        cuts = [
            d.measurement
            for d in self.ledger.drifts(self.cluster)
            if d.experiment_id == champion.experiment_id and d.significant
        ]
        if cuts:
            measurements = [m for m in measurements if m.index >= max(cuts)] or measurements
        return measurements

    def cells(self) -> tuple[ChampionCell, ...]:
        """The champion's cells, each averaged over its trusted measurements: throughput and,
        where every one of them reports it at the same length, the per-position acceptance."""
        by_cell: dict[str, list[CellResultRecord]] = {}
        for m in self.level():
            if not self.trusted(m):
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

    def noise(self, without: int | None = None) -> NoiseModel:
        """The cluster's noise model: the profile's prior and the ledger's repeated boots
        (``without``: an experiment whose boots since its last re-base are left out — the drift
        sentinel's, which a drift under test would otherwise pass off as noise)."""
        spec = self.profile.verdict.noise
        cuts: dict[int, list[int]] = {}
        for d in self.ledger.drifts(self.cluster):
            if d.significant:
                cuts.setdefault(d.experiment_id, []).append(d.measurement)
        groups: list[list[float]] = []
        for e in self.ledger.experiments(cluster=self.cluster):
            if e.status in (Status.CRASH, Status.VETOED, Status.INVALID):
                continue
            # a significant drift splits a config's boots: the level moved, not the noise
            segments: dict[int, list[float]] = {}
            for m in self.measurements(e.id):
                if self.trusted(m):
                    segment = sum(1 for c in cuts.get(e.id, []) if m.index >= c)
                    segments.setdefault(segment, []).append(objective(m.cells))
            if e.id == without and segments:
                del segments[max(segments)]
            groups.extend(v for v in segments.values() if len(v) >= 2)
        cells = max(1, len(self.profile.cells))
        return learn(
            prior_boot_cv=math.sqrt(spec.boot_to_boot**2 + spec.run_to_run**2 / cells),
            prior_run_cv=spec.run_to_run,
            prior_weight=spec.prior_weight,
            boot_groups=groups,
            run_groups=[],
        )

    def judge(self, e: ExperimentRecord, measurements: Sequence[Measurement]) -> Assessment:
        """``verdict.assess`` of experiment ``e`` measured so, against the champion's level and
        the noise estimate, with its knob's effect prior as this cluster's decided changes of
        it taught (``priors``; ``None`` for a knob the profile no longer has: the profile's
        prior) and, for an ordered knob, the other values of it measured against this champion
        (``pooling``; their changes then leave the prior, which would count them twice). A
        coupled move is judged with the prior of the knob whose value failed (``e.knob``), alone
        (``siblings``)."""
        champion = self.level()
        knob = e.knob
        in_space = knob is not None and knob in self.profile.space.names
        siblings = self.siblings(e) if in_space and self.profile.verdict.pool_values else []
        prior = (
            learned_prior(self.profile, self.ledger, knob, excluding={s.id for s in siblings})
            if knob and in_space
            else None
        )
        noise = self.noise()
        champion_logs = [math.log(objective(m.cells)) for m in champion]
        pooled = None
        held = self.current().config.as_dict().get(knob) if knob is not None else None
        if siblings and knob is not None and e.value is not None and held is not None:
            base = prior or base_prior(self.profile, knob)
            pooled = pool(
                self.profile.space.spec(knob),
                held,
                champion_logs,
                ValueBoots(e.value, tuple(math.log(objective(m.cells)) for m in measurements)),
                [
                    ValueBoots(s.value, self.trusted_logs(s.id))
                    for s in siblings
                    if s.value is not None
                ],
                boot_cv=noise.boot_cv,
                p_null=base.p_null,
                tau=math.log1p(base.effect_pct / 100),
            )
        return assess(
            self.profile.verdict,
            Evidence(
                candidate=[objective(m.cells) for m in measurements],
                champion=[objective(m.cells) for m in champion],
                confirmations=sum(1 for m in measurements if m.role == BootRole.CONFIRM),
                candidate_cells=[c for m in measurements for c in m.cells],
                champion_cells=champion[-1].cells,
                min_matmul_rate=self.profile.gates.min_matmul_rate,
            ),
            noise,
            prior,
            pooled,
        )

    def siblings(self, e: ExperimentRecord) -> list[ExperimentRecord]:
        """The decided changes of ``e``'s knob alone, measured against the current champion (its
        config but for that knob): the values ``pooling`` judges ``e`` with. None for a coupled
        move: it moved another knob too, so it is no value of one knob's curve."""
        if e.knob is None or e.coupled_knob is not None:
            return []
        champion = self.current()
        others = {k: v for k, v in champion.config.as_dict().items() if k != e.knob}
        out: list[ExperimentRecord] = []
        for s in self.ledger.experiments(cluster=self.cluster):
            if (
                s.id == e.id
                or s.kind != Kind.CANDIDATE
                or s.knob != e.knob
                or s.state != State.DECIDED
                or s.status not in (Status.DISCARD, Status.INCONCLUSIVE)
                or s.failure_class is not None
                or s.created_at < champion.since
            ):
                continue
            config = s.config.as_dict()
            if {k: v for k, v in config.items() if k != e.knob} == others:
                out.append(s)
        return out

    def trusted_logs(self, experiment_id: int) -> tuple[float, ...]:
        """The log objectives of an experiment's trusted measurements."""
        return tuple(
            math.log(objective(m.cells))
            for m in self.measurements(experiment_id)
            if self.trusted(m)
        )

    def boots_during(self, experiment_id: int) -> int:
        """The champion's boots since the experiment's first boot (its re-measurements for
        this experiment's verdict)."""
        mine = self.ledger.boots(experiment_id)
        if not mine:
            return 0
        theirs = self.ledger.boots(self.current().experiment_id)
        return sum(1 for b in theirs if b.started_at >= mine[0].started_at)

    def measured_after(self, experiment_id: int) -> bool:
        """Whether the champion was measured (a boot that came up and was torn down, not a
        failed one) after the experiment's last boot."""
        mine = self.ledger.boots(experiment_id)
        theirs = [
            b
            for b in self.ledger.boots(self.current().experiment_id)
            if b.status != BootStatus.FAILED
        ]
        return (theirs[-1].id if theirs else 0) >= (mine[-1].id if mine else 0)

    # ---- re-measuring -----------------------------------------------------------------------
    def due(self) -> bool:
        """Whether the champion is re-measured before the next proposal (``policy``'s rule)."""
        champion = self.ledger.champion(self.cluster)
        if champion is None:
            return False
        boots = [
            b for b in self.ledger.boots(champion.experiment_id) if b.status == BootStatus.DOWN
        ]
        if not boots:
            return False
        last = boots[-1].ended_at or boots[-1].started_at
        decided_since = sum(
            1
            for e in self.ledger.experiments(cluster=self.cluster)
            if e.kind == Kind.CANDIDATE
            and e.status not in (None, Status.VETOED)
            and e.decided_at is not None
            and e.decided_at > last
        )
        return policy.remeasure_due(
            self.profile.verdict,
            trusted_boots=sum(1 for m in self.level() if self.trusted(m)),
            decided_since=decided_since,
            age_s=(datetime.now(UTC) - last).total_seconds(),
        )

    def remeasure(self, rnd: RoundRecord) -> NodeError | None:
        """A fresh boot of the champion; records its drift. A boot that flags a drift
        (``policy.suspected_drift``) is followed by one more, a confirmation (role ``confirm``),
        and the level is re-based only when it confirms the drift (``policy.drift_confirmed``);
        otherwise both boots are the champion's measurements like any other. A boot with a
        node's clocks off is measured again (``policy.CHAMPION_CLOCK_TRIES`` in all); it never
        counts as drift. The failure, if a boot failed."""
        e = self.ledger.experiment(self.current().experiment_id)
        self.display.phase("re-measuring the champion")
        run_id = self.runlog.experiment_run(rnd, e)
        failure, latest = self._boot(e, run_id, BootRole.REMEASURE)
        if latest is None:
            return failure
        flag = self._record_remeasure(e.id, run_id, latest)
        if flag is None:
            return None
        if not self.profile.verdict.confirm_drift:  # the loop before #18: re-based on the flag
            self._add_drift(e.id, latest, flag.before, significant=True)
            return None
        self.display.note(
            f"  the champion measured {100 * (flag.after / flag.before - 1):+.1f}% vs its level "
            f"({flag.sigmas:+.1f} standard errors): a suspected drift, booting it once more "
            "to confirm"
        )
        failure, confirmation = self._boot(e, run_id, BootRole.CONFIRM)
        if confirmation is None:
            return failure
        self._record_confirmation(e.id, run_id, flag, confirmation)
        return None

    def _boot(
        self, e: ExperimentRecord, run_id: str, role: BootRole
    ) -> tuple[NodeError | None, Measurement | None]:
        """One measurement of the champion with every node's clocks right (taken again when
        they were off, ``policy.CHAMPION_CLOCK_TRIES`` in all): the failure if a boot failed,
        and the measurement (``None`` if it failed or the clocks were off every time)."""
        for attempt in range(1, policy.CHAMPION_CLOCK_TRIES + 1):
            failure = self.booter.measure(e, run_id, role=role, measurement=None)
            if failure is not None:
                self.display.note(f"  the champion's re-measurement failed: {failure.message}")
                return failure, None
            latest = [m for m in self.measurements(e.id) if m.complete][-1]
            if self.trusted(latest):
                return None, latest
            slow = ", ".join(map(str, slow_ranks(latest.cells, self.profile.gates.min_matmul_rate)))
            again = attempt < policy.CHAMPION_CLOCK_TRIES
            self.display.note(
                f"  the champion's re-measurement ran with clocks off on node(s) {slow}: "
                "it is neither drift nor the champion's level"
                + ("; measuring again" if again else "")
            )
        return None, None

    def settle(self) -> None:
        """Re-base the champion's level once more if a kill fell between a re-measurement's
        drift and its re-base (a resume): once re-measured, the champion's objective is its
        trusted level's."""
        champion = self.ledger.champion(self.cluster)
        if champion is None or not any(
            d.experiment_id == champion.experiment_id for d in self.ledger.drifts(self.cluster)
        ):
            return
        level = objective_of([objective(m.cells) for m in self.level()])
        if not math.isclose(level, champion.objective, rel_tol=1e-9):
            self.ledger.set_champion_objective(self.cluster, level)

    def _trusted_level(self) -> tuple[list[Measurement], int | None]:
        """The champion's trusted measurements since its last re-base, oldest first, and the
        position among them of its last flagged boot not confirmed (the re-measurement just
        before a drift confirmation boot: a ``confirm`` boot after a ``remeasure`` one)."""
        ms = [m for m in self.level() if self.trusted(m)]
        flagged: int | None = None
        remeasured = False
        for i, m in enumerate(ms):
            if m.role == BootRole.CONFIRM and remeasured and i > 0:
                flagged = i - 1
            remeasured = remeasured or m.role == BootRole.REMEASURE
        return ms, flagged

    def _record_remeasure(
        self, experiment_id: int, run_id: str, latest: Measurement
    ) -> policy.Shift | None:
        """Record a re-measurement (never a re-base on its own); the suspected drift it flags."""
        ms, flagged = self._trusted_level()
        level = [objective(m.cells) for m in ms]
        before = objective_of(level[:-1]) if len(level) > 1 else level[-1]
        flag = policy.suspected_drift(level, self.noise(experiment_id).boot_cv, flagged)
        self._add_drift(experiment_id, latest, before, significant=False)
        self.runlog.remeasured(run_id, objective(latest.cells), latest.index)
        return flag

    def _record_confirmation(
        self, experiment_id: int, run_id: str, flag: policy.Shift, confirmation: Measurement
    ) -> None:
        """Record the confirmation boot of a suspected drift; re-base the level on the boots
        from the flag on if it confirms the drift (a significant drift recorded at the first
        of them: ``level`` starts there)."""
        ms, _ = self._trusted_level()
        level = [objective(m.cells) for m in ms]
        rebase = policy.drift_confirmed(level, flag, self.noise(experiment_id).boot_cv)
        self._add_drift(experiment_id, confirmation, flag.before, significant=False)
        self.runlog.remeasured(run_id, objective(confirmation.cells), confirmation.index)
        if rebase is None:
            self.display.note(
                "  not confirmed: the champion's level keeps its history, these boots included"
            )
            return
        self._add_drift(experiment_id, ms[rebase.start], rebase.before, significant=True)
        moved = 100 * (rebase.after / rebase.before - 1)
        self.display.note(
            f"  drift confirmed: the champion measures {moved:+.1f}% vs before over "
            f"{len(level) - rebase.start} boots; comparisons re-baselined on them"
        )

    def _add_drift(
        self, experiment_id: int, m: Measurement, before: float, *, significant: bool
    ) -> None:
        """A drift row for measurement ``m`` against the level ``before``; the champion's
        objective set to its level (re-based when ``significant``)."""
        self.ledger.add_drift(
            cluster=self.cluster,
            experiment_id=experiment_id,
            measurement=m.index,
            before=before,
            after=objective(m.cells),
            significant=significant,
        )
        crashpoint("drift.recorded")
        trusted = [objective(m.cells) for m in self.level()]
        self.ledger.set_champion_objective(self.cluster, objective_of(trusted))
        crashpoint("champion.rebased")
