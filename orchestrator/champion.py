"""The champion's evidence: its trusted boots, its level and the cluster's noise estimate, and
how a verdict judges a candidate against them.

Every verdict compares a candidate with the champion, so the champion's level is measured on
several boots and again every so often (``remeasure``: when and how it is booted, the drift
sentinel, the boots that kept it set aside). Its level is its trusted boots since the last cut
(``cuts``: a confirmed drift, or a keep's boots set aside). The noise estimate — how much one
boot's objective scatters on this cluster — is the profile's prior pooled with every config
the ledger measured on several boots, each split at its cuts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime

from agents import ChampionCell
from knobs.config import Config
from knobs.records import CellResultRecord
from knobs.spec import EffectPrior, Value
from knobs.vocabulary import BootRole, BootStatus, EventKind, Kind, State, Status
from ledger import ChampionRecord, ExperimentRecord, Ledger
from orchestrator import knob_renames, revision
from orchestrator.acceptance import Null, acceptance_shift, counts, moved
from orchestrator.evolution import fit, fit_champion, record_profile
from orchestrator.greedy import irreproducible
from orchestrator.host_stalls import boot_error, disturbed, reusable
from orchestrator.measurements import Measurement, read_cluster_measurements, read_measurements
from orchestrator.noise import NoiseModel, learn
from orchestrator.pooling import ValueBoots, pool
from orchestrator.priors import MEASURING, base_prior, learned_prior
from orchestrator.profile import Profile
from orchestrator.rendering import (
    digests,
    dropped,
    gained,
    knob_events,
    legacy_cut,
    orders,
    rendered_as,
    revised,
    stale_line,
)
from orchestrator.step_cost import LAW_HOLDS, draft_changes, law_null
from orchestrator.verdict import Assessment, Evidence, assess, objective, objective_of


class ChampionEvidence:
    """What the ledger knows of a cluster's champion and its noise; re-measures it."""

    def __init__(self, profile: Profile, ledger: Ledger) -> None:
        self.profile = profile
        self.ledger = ledger
        self.cluster = profile.cluster.name
        self._orders: tuple[tuple[str, ...], ...] | None = None

    # ---- reading the ledger -----------------------------------------------------------------
    def fitted(self) -> ChampionRecord | None:
        """The champion, if there is one, its config fitted to the profile's knob space (a
        knob the profile gained at its default, one it lost dropped: ``evolution``)."""
        champion = self.ledger.champion(self.cluster)
        return None if champion is None else fit_champion(self.profile.space, self.ledger, champion)

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
        in the ledger the first time it is seen (``evolution.knob_changes``), and the profile
        recorded (``evolution.record_profile``)."""
        return record_profile(self.profile, self.ledger)

    def measurements(self, experiment_id: int) -> list[Measurement]:
        """Any experiment's measurements, complete when they have every cell of the profile."""
        return read_measurements(self.ledger, experiment_id, self.profile.cells)

    def trusted(self, m: Measurement) -> bool:
        """Complete, and every node's clocks were right."""
        return m.trusted(self.profile.gates.min_matmul_rate)

    def cuts(self) -> dict[int, list[int]]:
        """Where each config's level starts again, by experiment: a confirmed drift's first
        boot, and a champion's first boot of its own when the boots that kept it were set
        aside (``policy.keep_boots_inflated``). Boots before a cut are another level's."""
        cuts: dict[int, list[int]] = {}
        for d in self.ledger.drifts(self.cluster):
            if d.significant:
                cuts.setdefault(d.experiment_id, []).append(d.measurement)
        for experiment_id, detail in self.set_aside().items():
            at = detail.get("measurement")
            if isinstance(at, int):
                cuts.setdefault(experiment_id, []).append(at)
        return cuts

    def set_aside(self) -> dict[int, dict[str, object]]:
        """The champions whose keep's boots were set aside (``remeasure``), by experiment, with
        the event's evidence: from which measurement their level starts, both levels, the
        standard errors."""
        return {
            int(event.subject): event.detail
            for event in self.ledger.events(self.cluster, EventKind.KEEP_BOOTS_SET_ASIDE)
        }

    def rendered_now(self, champion: ChampionRecord) -> list[Measurement]:
        """The champion's complete measurements of its launchers as the profile renders them
        now (``rendering``: those of another rendering are set aside)."""
        now = digests(self.profile, champion.config, self.orders())
        cut = legacy_cut(knob_events(self.ledger, self.cluster, champion.experiment_id))
        ms = self.measurements(champion.experiment_id)
        return [m for m in ms if m.complete and rendered_as(m, now, cut)]

    def orders(self) -> tuple[tuple[str, ...], ...]:
        """The knobs' orders of the profiles recorded for the cluster (``rendering.orders``),
        read once: a revision recorded later is the profile of now, whose order ``digests``
        tries anyway."""
        if self._orders is None:
            self._orders = orders(self.ledger, self.cluster)
        return self._orders

    def revised(self) -> list[str]:
        """What the profile changes of how configs render against the last profile recorded
        for the cluster (``rendering.revised``): asked before a round records it."""
        return revised(self.profile, revision.last(self.ledger, self.cluster))

    def restated(self, revised: Sequence[str] = ()) -> str | None:
        """The line saying the champion is measured again because its launchers render
        differently now than when it was last measured, and why (the knob changes recorded
        since, and ``revised``: what ``revised`` said before the profile was recorded);
        ``None`` when they do not, or when one of its measurements rendered as now: that one
        is its level (``level``), and it is not measured again."""
        champion = self.fitted()
        if champion is None:
            return None
        complete = [m for m in self.measurements(champion.experiment_id) if m.complete]
        counted = {m.index for m in self.rendered_now(champion)}
        # a measurement of the launchers as they render now (a knob put back as it was) is
        # the champion's level again: nothing is measured again, and nothing is said
        if not complete or counted:
            return None
        since = complete[-1].boots[0][1]
        events = knob_events(self.ledger, self.cluster, champion.experiment_id)
        reasons = [*revised] + [
            dropped(e.subject) if e.kind == EventKind.KNOB_REMOVED else gained(e.subject)
            for e in events
            if e.created_at >= since
        ]
        previous = sum(1 for m in complete if m.index not in counted)
        return stale_line(list(dict.fromkeys(reasons)), previous)

    def realign(self) -> None:
        """The champion's recorded objective set to its level where the rendering sets a later
        measurement aside and keeps an earlier one (a knob put back as it was): the level in
        force, not the set-aside measurement's, is what ``status``, the report and MLflow show
        and what changes are compared with."""
        champion = self.fitted()
        if champion is None:
            return
        complete = [m for m in self.measurements(champion.experiment_id) if m.complete]
        counted = {m.index for m in self.rendered_now(champion)}
        if not counted or all(m.index in counted for m in complete):
            return
        trusted = [objective(m.cells) for m in self.level() if self.trusted(m)]
        if trusted and objective_of(trusted) != champion.objective:
            self.ledger.set_champion_objective(self.cluster, objective_of(trusted))

    def level(
        self, champion: ChampionRecord | None = None, until: datetime | None = None
    ) -> list[Measurement]:
        """The champion's complete measurements with every node's clocks right, since its last
        cut (``cuts``: a confirmed drift, or the boots that kept it set aside), of its launchers
        as the profile renders them now (``rendered_now``); of those, the ones no busy host
        disturbed (``host_stalls.disturbed``) while there is one. ``champion``: another (a past
        one, fitted) than the current; ``until``: its level as it stood then, of the boots
        started by then and the cuts among them (``compared_with.level_then``)."""
        champion = champion or self.current()
        complete = self.rendered_now(champion)
        if until is not None:
            complete = [m for m in complete if all(at <= until for _, at in m.boots)]
        # a baseline measured only with a node's clocks off is all there is until re-measured
        measurements = [m for m in complete if self.trusted(m)] or complete
        cuts = self.cuts().get(champion.experiment_id, [])
        if until is not None:  # a cut made since is another level's, not the one of then
            last = max((m.index for m in complete), default=-1)
            cuts = [c for c in cuts if c <= last]
        if cuts:
            measurements = [m for m in measurements if m.index >= max(cuts)] or measurements
        # a boot a busy host disturbed measured the host: not the level while another is there
        return [m for m in measurements if not disturbed(m.cells)] or measurements

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
        sentinel's, which a drift under test would otherwise pass off as noise). A boot whose
        hosts' stalls may have moved its objective (``host_stalls.disturbed``) teaches nothing:
        its scatter is the host's."""
        spec = self.profile.verdict.noise
        cuts = self.cuts()
        groups: list[list[float]] = []
        measured = read_cluster_measurements(self.ledger, self.cluster, self.profile.cells)
        for e in self.ledger.experiments(cluster=self.cluster):
            if e.status in (Status.CRASH, Status.VETOED, Status.INVALID):
                continue
            # a cut splits a config's boots: the level moved (or was chosen), not the noise
            segments: dict[tuple[int, tuple[str, ...]], list[float]] = {}
            last: tuple[int, tuple[str, ...]] | None = None
            for m in measured.get(e.id, []):
                # a boot a busy host may have moved measured the host: not the cluster's noise
                if self.trusted(m) and not disturbed(m.cells):
                    # and another rendering (a knob's flag dropped) is another engine's level
                    cut = sum(1 for c in cuts.get(e.id, []) if m.index >= c)
                    segment = (cut, tuple(sorted({r or "" for r, _ in m.boots})))
                    segments.setdefault(segment, []).append(objective(m.cells))
                    last = segment
            if e.id == without and last is not None:
                del segments[last]
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
        (``pooling``; their changes then leave the prior, which would count them twice; their
        boots, as every boot the verdict weighs, each with its stall error, a boot a busy host
        disturbed left out: ``host_stalls.reusable``). A
        coupled move is judged with the prior of the knob whose value failed (``e.knob``), alone
        (``siblings``). Where the acceptance counters say what the change does (``null``),
        that is the verdict's null, and the change is judged alone: its counters measure it
        better than its neighbours' throughput. A K change's null (its counters less the step
        cost, ``step_cost``) only where no other K was measured against this champion: the
        neighbours' boots share this one's champion error, the law's fit does not know it."""
        # a change recorded under a knob's old name (resumed across a rename) is judged as
        # one of the knob now: its prior, its pooled values (``knob_renames``)
        e = knob_renames.experiment(self.profile.space, e)
        champion = self.level()
        knob = e.knob
        in_space = knob is not None and knob in self.profile.space.names
        held = self.current().config.as_dict().get(knob) if knob is not None else None
        counters = acceptance_shift([m.cells for m in measurements], [m.cells for m in champion])
        siblings = self.siblings(e) if in_space and self.profile.verdict.pool_values else []
        # their boots as pooling reuses them: a disturbed one left out, any other with its error
        others = {s.id: self.value_boots(s.id, s.value) for s in siblings if s.value is not None}
        siblings = [s for s in siblings if s.id in others and others[s.id].logs]
        null = self.null(e, counters, held, pooled=bool(siblings))
        if null is not None:  # judged alone: the counters measure it better than its neighbours
            siblings = []
        prior = (
            null.prior
            if null is not None
            else learned_prior(self.profile, self.ledger, knob, excluding={s.id for s in siblings})
            if knob and in_space
            else None
        )
        noise = self.noise()
        champion_logs = [math.log(objective(m.cells)) for m in champion]
        candidate_stalls = [boot_error(m.cells) for m in measurements]
        champion_stalls = [boot_error(m.cells) for m in champion]
        pooled = None
        if siblings and knob is not None and e.value is not None and held is not None:
            base = prior or base_prior(self.profile, knob)
            logs = tuple(math.log(objective(m.cells)) for m in measurements)
            pooled = pool(
                self.profile.space.spec(knob),
                held,
                champion_logs,
                ValueBoots(e.value, logs, tuple(candidate_stalls)),
                [others[s.id] for s in siblings],
                boot_cv=noise.boot_cv,
                p_null=base.p_null,
                tau=math.log1p(base.effect_pct / 100),
                champion_errors=champion_stalls,
            )
        return assess(
            self.profile.verdict,
            Evidence(
                candidate=[objective(m.cells) for m in measurements],
                champion=[objective(m.cells) for m in champion],
                confirmations=sum(1 for m in measurements if m.role == BootRole.CONFIRM),
                candidate_cells=[c for m in measurements for c in m.cells],
                # its boots in force, as the objective is judged on: one boot's p90 is noisy
                champion_cells=[c for m in champion for c in m.cells],
                champion_texts=[c for m in champion for c in m.cells],
                min_matmul_rate=self.profile.gates.min_matmul_rate,
                acceptance=None if null is None else null.spike,
                null_from="counters" if null is None else null.source,
                counters=counters,
                held=held,
                candidate_stalls=candidate_stalls,
                champion_stalls=champion_stalls,
            ),
            noise,
            prior,
            pooled,
        )

    def null(
        self,
        e: ExperimentRecord,
        counters: tuple[float, float] | None,
        held: Value | None,
        *,
        pooled: bool = False,
    ) -> Null | None:
        """The verdict's null where the acceptance counters say what ``e`` does: for the draft
        length, their shift less the step cost this cluster's K changes taught
        (``step_cost``), unless other K values measured against this champion judge it
        (``pooled``: their boots share its champion's error, which pooling models and the
        law's fit does not); for another knob, their shift, where its changes mostly do nothing
        more (``acceptance.counts``: the knob's prior of that, as this cluster measured it).
        Only where the counters moved (``acceptance.moved``): a K change whose counters read
        alike would rest on the step cost alone, which the law's prior, not the counters,
        decides until many K changes are measured. ``None``: judged as any other change (the
        counters did not move or read nothing, a coupled move, a knob the profile no longer
        has)."""
        knob = e.knob
        if knob is None or knob not in self.profile.space.names or e.coupled_knob is not None:
            return None
        # the counters said nothing (and the knob's prior is a read of the ledger): as before
        if counters is None or not moved(counters):
            return None
        spec = self.profile.space.spec(knob)
        if spec.role == "draft_tokens":
            if pooled or not (isinstance(held, int) and isinstance(e.value, int)):
                return None
            space = self.profile.space
            experiments = knob_renames.experiments(space, self.ledger, cluster=self.cluster)
            changes = draft_changes(self.ledger, experiments, knob, MEASURING)
            spike = law_null(counters, held, e.value, changes)
            if spike is None:
                return None
            own = learned_prior(self.profile, self.ledger, knob) or base_prior(self.profile, knob)
            prior = EffectPrior(
                p_null=LAW_HOLDS,
                effect_pct=own.effect_pct,
                source=f"its counters less the step cost fitted to {len(changes)} K change(s)",
            )
            return Null(prior, spike, "draft law")
        prior = learned_prior(self.profile, self.ledger, knob, beyond=True) or base_prior(
            self.profile, knob
        )
        return Null(prior, counters, "counters") if counts(counters, prior) else None

    def siblings(self, e: ExperimentRecord) -> list[ExperimentRecord]:
        """The decided changes of ``e``'s knob alone, measured against the current champion (its
        config but for that knob), whose verdicts measured an effect (``priors.MEASURING``): the
        values ``pooling`` judges ``e`` with. Not a value discarded past a guardrail: MNBT below
        a time-to-first-token cliff runs in another regime, and its speed (−10 %) is no point on
        the curve of the values inside. None for a coupled move: it moved another knob too, so
        it is no value of one knob's curve. Each change's config is compared as the profile
        sees it now (``evolution.fit``): a value measured before the profile gained a knob ran
        with its parent champion's value of it."""
        if e.knob is None or e.coupled_knob is not None:
            return []
        champion = self.current()
        others = {k: v for k, v in champion.config.as_dict().items() if k != e.knob}
        out: list[ExperimentRecord] = []
        for s in knob_renames.experiments(self.profile.space, self.ledger, cluster=self.cluster):
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
            config = fit(self.profile.space, self.ledger, s).config.as_dict()
            if {k: v for k, v in config.items() if k != e.knob} != others:
                continue
            verdict = self.ledger.verdict(s.id)
            if verdict is not None and verdict.rule in MEASURING:
                out.append(s)
        return out

    def value_boots(self, experiment_id: int, value: Value) -> ValueBoots:
        """An earlier experiment's trusted measurements as a later verdict reuses them
        (``pooling``): each one's log objective with its stall error, a measurement a busy host
        disturbed left out (``host_stalls.reusable``)."""
        kept = [
            (math.log(objective(m.cells)), error)
            for m in self.measurements(experiment_id)
            if self.trusted(m) and (error := reusable(m.cells)) is not None
        ]
        return ValueBoots(value, tuple(g for g, _ in kept), tuple(x for _, x in kept))

    def irreproducible_texts(self) -> tuple[list[tuple[str, str]], int]:
        """The champion's greedy texts, as (cell, prompt) pairs, when its measurements at its
        level reproduced none of them (``greedy.irreproducible``; else none), and how many
        measurements those are."""
        level = self.level()
        return irreproducible([c for m in level for c in m.cells]), len(level)

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
