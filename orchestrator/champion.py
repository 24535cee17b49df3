"""The champion's evidence: its trusted boots, the cluster's noise estimate, its re-measurements
and drift.

Every verdict compares a candidate with the champion, so the champion's level is measured on
several boots (topped up after each keep) and again every so often (the drift sentinel); a
significant drift re-bases the level on the boots after it. The noise estimate — how much one
boot's objective scatters on this cluster — is the profile's prior pooled with every config
the ledger measured on several boots. When to re-measure and what counts as a drift is
``policy``'s to say; this module reads the ledger and boots.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import UTC, datetime

from agents import ChampionCell
from cluster.errors import NodeError
from knobs.config import Config
from knobs.records import CellResultRecord
from knobs.vocabulary import BootRole, BootStatus, Kind, Status
from ledger import ChampionRecord, Ledger, RoundRecord
from orchestrator import policy
from orchestrator.boot import Booter
from orchestrator.display import RoundDisplay
from orchestrator.measurements import Measurement, read_measurements
from orchestrator.noise import NoiseModel, learn
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
    def current(self) -> ChampionRecord:
        """The champion (a round has one once its baseline is decided)."""
        champion = self.ledger.champion(self.cluster)
        assert champion is not None
        return champion

    def config(self) -> Config | None:
        """The champion's config, if there is a champion."""
        champion = self.ledger.champion(self.cluster)
        return champion.config if champion is not None else None

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

    def noise(self) -> NoiseModel:
        """The cluster's noise model: the profile's prior and the ledger's repeated boots."""
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
            groups.extend(v for v in segments.values() if len(v) >= 2)
        cells = max(1, len(self.profile.cells))
        return learn(
            prior_boot_cv=math.sqrt(spec.boot_to_boot**2 + spec.run_to_run**2 / cells),
            prior_run_cv=spec.run_to_run,
            prior_weight=spec.prior_weight,
            boot_groups=groups,
            run_groups=[],
        )

    def judge(self, knob: str | None, measurements: Sequence[Measurement]) -> Assessment:
        """``verdict.assess`` of a change of ``knob`` measured so, against the champion's level
        and the noise estimate, with the knob's declared effect prior (``None`` for a knob the
        profile no longer has: the profile's prior)."""
        champion = self.level()
        space = self.profile.space
        prior = space.spec(knob).effect_prior if knob is not None and knob in space.names else None
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
            self.noise(),
            prior,
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
        """A fresh boot of the champion; records its drift and re-baselines on a real one.
        A boot with a node's clocks off is measured again (``policy.CHAMPION_CLOCK_TRIES`` in
        all); it never counts as drift. The failure, if the boot failed."""
        champion = self.current()
        before = [objective(m.cells) for m in self.level()]
        e = self.ledger.experiment(champion.experiment_id)
        self.display.phase("re-measuring the champion")
        run_id = self.runlog.experiment_run(rnd, e)
        for attempt in range(1, policy.CHAMPION_CLOCK_TRIES + 1):
            failure = self.booter.measure(e, run_id, role=BootRole.REMEASURE, measurement=None)
            if failure is not None:
                self.display.note(f"  the champion's re-measurement failed: {failure.message}")
                return failure
            latest = [m for m in self.measurements(e.id) if m.complete][-1]
            if self.trusted(latest):
                break
            slow = ", ".join(map(str, slow_ranks(latest.cells, self.profile.gates.min_matmul_rate)))
            again = attempt < policy.CHAMPION_CLOCK_TRIES
            self.display.note(
                f"  the champion's re-measurement ran with clocks off on node(s) {slow}: "
                "it is neither drift nor the champion's level"
                + ("; measuring again" if again else "")
            )
        else:
            return None
        self._record_drift(e.id, run_id, before, latest)
        return None

    def _record_drift(
        self, experiment_id: int, run_id: str, before: list[float], latest: Measurement
    ) -> None:
        after = objective(latest.cells)
        old, significant = policy.drift(before, after, self.noise().boot_cv)
        drift = self.ledger.add_drift(
            cluster=self.cluster,
            experiment_id=experiment_id,
            measurement=latest.index,
            before=old,
            after=after,
            significant=significant,
        )
        trusted = [objective(m.cells) for m in self.level()]
        self.ledger.set_champion_objective(self.cluster, objective_of(trusted))
        self.runlog.remeasured(run_id, after, latest.index)
        if significant:
            self.display.note(
                f"  drift: the champion measured {drift.drift_pct:+.1f}% vs before; "
                "comparisons re-baselined on its new measurements"
            )
