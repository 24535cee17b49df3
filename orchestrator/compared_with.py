"""What a change's Δ is against: its champion's level in force when the verdict was made.

A verdict compares a change with its champion's level in force (``ChampionEvidence.level``:
the champion's boots as measured again by then), never with the objective the champion's own
row records (what its verdict measured, on its first boots). So a change's row may read below
its champion's row with a positive Δ, or above it with a negative one, and a round's keeps'
Δ need not multiply up to what the champions' levels say the round gained. Where a row's
objective beside its champion's would mislead, its Δ says what it is against; one home for
those words (the report's table, results.tsv's description) and for the report's headline
gain (``Gain``), in the words ``status`` uses (``champion_level``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from knobs.vocabulary import UNMEASURED, Kind, State, Status
from ledger import ChampionRecord, ExperimentRecord, Ledger
from orchestrator import champion_level
from orchestrator.champion import ChampionEvidence
from orchestrator.evolution import Lineage, fit_champion
from orchestrator.profile import Profile
from orchestrator.verdict import objective, objective_of


@dataclass(frozen=True)
class ComparedWith:
    """What a change's Δ was computed against."""

    #: the change's experiment, its objective and its Δ
    experiment: int
    objective: float
    delta_pct: float
    #: its champion (the experiment it was proposed against) and that champion's row's
    #: objective (what the champion's own verdict measured)
    champion: int
    row: float | None
    #: the champion's level in force when the change was judged, and over how many boots
    #: (``None``: a verdict that did not record them)
    level: float
    boots: int | None

    @property
    def misleading(self) -> bool:
        """Whether the row's objective beside its champion's row reads the other way round
        from its Δ (below it with a gain, above it with a loss)."""
        if self.row is None or round(self.delta_pct, 2) == 0:
            return False
        return (self.objective < self.row) == (self.delta_pct > 0)

    def level_words(self) -> str:
        """``#1's level in force then, 9321.6 over 2 boot(s)``."""
        over = "" if self.boots is None else f" over {self.boots} boot(s)"
        return f"#{self.champion}'s level in force then, {self.level:.1f}{over}"

    def cell(self) -> str:
        """The report's ``Δ against`` cell: ``#1: 9321.6 over 2 boot(s)``."""
        over = "" if self.boots is None else f" over {self.boots} boot(s)"
        return f"#{self.champion}: {self.level:.1f}{over}"

    def words(self) -> str:
        """What results.tsv's description adds to a misleading row."""
        row = "" if self.row is None else f"; its row keeps {self.row:.2f}"
        return (
            f"Δ {self.delta_pct:+.2f}% is against champion {self.level_words()} (measured "
            f"again since its verdict{row}), not against its row's objective"
        )


def compared_with(
    profile: Profile, ledger: Ledger, experiments: Sequence[ExperimentRecord]
) -> dict[int, ComparedWith]:
    """By experiment, what each measured change of ``experiments`` (decided, with a Δ) was
    compared with: its parent champion (``evolution.Lineage.parent``) and the level its
    verdict recorded (``champion_objective``; one an older release did not record is the
    objective over its Δ, as the verdict computed it)."""
    cluster = profile.cluster.name
    lineage = Lineage.read(profile.space, ledger, cluster, ledger.experiments(cluster=cluster))
    out: dict[int, ComparedWith] = {}
    for e in experiments:
        if (
            e.kind != Kind.CANDIDATE
            or e.state != State.DECIDED
            or e.status in UNMEASURED
            or not e.objective
            or e.delta_pct is None
            or e.delta_pct <= -100.0
        ):
            continue
        parent = lineage.parent(e)
        if parent is None:
            continue
        verdict = ledger.verdict(e.id)
        stats = {} if verdict is None else verdict.stats
        level = stats.get("champion_objective")
        boots = stats.get("champion_boots")
        out[e.id] = ComparedWith(
            experiment=e.id,
            objective=e.objective,
            delta_pct=e.delta_pct,
            champion=parent.id,
            row=parent.objective,
            level=float(level)
            if isinstance(level, int | float) and level > 0
            else e.objective / (1.0 + e.delta_pct / 100.0),
            boots=boots if isinstance(boots, int) else None,
        )
    return out


def tsv_notes(profile: Profile, ledger: Ledger) -> dict[int, str]:
    """What results.tsv adds to a row's description, by experiment: the champion's level in
    force (``champion_level.row_notes``), and where a row's objective beside its champion's
    would mislead, what its Δ is against (``ComparedWith.words``)."""
    notes = champion_level.row_notes(profile, ledger)
    experiments = ledger.experiments(cluster=profile.cluster.name)
    for e, compared in compared_with(profile, ledger, experiments).items():
        if compared.misleading:
            notes[e] = f"{notes[e]}; {compared.words()}" if e in notes else compared.words()
    for e, said in _cells_changed(profile, ledger, experiments).items():
        notes[e] = f"{notes[e]}; {said}" if e in notes else said
    return notes


def _cells_changed(
    profile: Profile, ledger: Ledger, experiments: Sequence[ExperimentRecord]
) -> dict[int, str]:
    """By experiment, where a row's objective sums other bench cells than the row before it
    (the profile removed or added a cell between them): which, so that the objective column's
    change of scale is not read as the config's. A row's cells are its first measured boot's
    (what its verdict measured), a cell renamed since under its name now."""
    renamed = {c.renamed_from: c.name for c in profile.cells if c.renamed_from}
    readings = ledger.cluster_cell_results(profile.cluster.name)
    out: dict[int, str] = {}
    last: tuple[str, ...] | None = None
    for e in sorted(experiments, key=lambda x: x.id):
        mine = readings.get(e.id, [])
        if e.objective is None or not mine:
            continue
        first = min(r.boot_id for r in mine)
        cells = tuple(
            sorted({renamed.get(r.result.cell, r.result.cell) for r in mine if r.boot_id == first})
        )
        if last is not None and cells != last:
            out[e.id] = (
                f"its objective sums cells {', '.join(cells)}, the row before's "
                f"{', '.join(last)}: the profile's cells changed between them"
            )
        last = cells
    return out


def level_then(
    evidence: ChampionEvidence, champion: ChampionRecord, at: datetime
) -> ChampionRecord:
    """``champion`` with its level as it stood at ``at`` (a past round's end). The champion
    table keeps one objective a champion, its level when it was replaced or now: a champion
    measured again after ``at`` (a later round's re-measure, its drift sentinel) has there a
    level that round never saw. Then its level is its trusted boots started by ``at`` under
    the cuts made among them (``ChampionEvidence.level``); otherwise what the table keeps."""
    ledger = evidence.ledger
    if not any(b.started_at > at for b in ledger.boots(champion.experiment_id)):
        return champion
    fitted = fit_champion(evidence.profile.space, ledger, champion)
    trusted = [objective(m.cells) for m in evidence.level(fitted, at) if evidence.trusted(m)]
    if not trusted:
        return champion
    return champion.model_copy(update={"objective": objective_of(trusted)})


def level_in_force_then(
    evidence: ChampionEvidence, champion: ChampionRecord, at: datetime
) -> champion_level.LevelInForce | None:
    """``champion_level.level_in_force`` as it stood at ``at`` (a past round's end): its level
    then (``level_then``) where it is not what its row records, over its trusted boots started
    by then. A report of a past round says that round's champion, not what later rounds
    measured of it."""
    ledger = evidence.ledger
    row = ledger.experiment(champion.experiment_id).objective
    fitted = fit_champion(evidence.profile.space, ledger, champion)
    boots = sum(1 for m in evidence.level(fitted, at) if evidence.trusted(m))
    if row is None or not boots:  # none rendered as now: its row's measurement says it
        return None
    then = level_then(evidence, champion, at).objective
    if math.isclose(then, row, rel_tol=1e-9):
        return None
    return champion_level.LevelInForce(champion.experiment_id, row, then, boots)


@dataclass(frozen=True)
class Gain:
    """A round's champion at its start and its end, by their levels in force (the champion
    table's: each one's level when it was replaced, or now), beside their rows' objectives,
    and what the round's keeps measured against their champions of the time."""

    start: ChampionRecord
    end: ChampionRecord
    #: the rows' objectives (what each one's verdict measured)
    start_row: float | None
    end_row: float | None
    #: the round's keeps: (experiment, its Δ, its champion's level then)
    keeps: tuple[ComparedWith, ...]

    @staticmethod
    def _again(level: float, row: float | None) -> bool:
        return row is not None and not math.isclose(level, row, rel_tol=1e-9)

    def words(self) -> str:
        """The report's headline: ``the champion +6.4 % by the champions' levels in force,
        9180.0 → 9771.8 (#1 → #10; both measured again since their verdicts, whose rows keep
        9477.7 and 10257.7); the keep #10 measured +11.74 % against #1's level in force then,
        9180.0 over 4 boot(s)``."""
        start, end = self.start, self.end
        if start.experiment_id == end.experiment_id:
            kept = (
                f", measured again since its verdict (its row keeps {self.end_row:.1f})"
                if self._again(end.objective, self.end_row)
                else ""
            )
            return (
                f"no keep: the champion #{end.experiment_id} it started from, its level in "
                f"force {end.objective:.1f}{kept}"
            )
        said = (
            f"the champion {(end.objective / start.objective - 1) * 100:+.1f} % by the "
            f"champions' levels in force, {start.objective:.1f} → {end.objective:.1f} "
            f"(#{start.experiment_id} → #{end.experiment_id}"
        )
        again = [
            (c.experiment_id, row)
            for c, row in ((start, self.start_row), (end, self.end_row))
            if self._again(c.objective, row)
        ]
        if len(again) == 2:
            said += (
                f"; both measured again since their verdicts, whose rows keep "
                f"{again[0][1]:.1f} and {again[1][1]:.1f}"
            )
        elif again:
            said += (
                f"; #{again[0][0]} measured again since its verdict, whose row keeps "
                f"{again[0][1]:.1f}"
            )
        said += ")"
        if self.keeps:
            each = ", ".join(
                f"#{k.experiment} {k.delta_pct:+.2f} % against {k.level_words()}"
                for k in self.keeps
            )
            said += f"; the keep{'s' if len(self.keeps) > 1 else ''} measured {each}"
        return said


def gain(
    ledger: Ledger,
    champions: tuple[ChampionRecord | None, ChampionRecord | None],
    experiments: Sequence[ExperimentRecord],
    compared: Mapping[int, ComparedWith],
) -> Gain | None:
    """A round's ``Gain``, from the champions it started and ended with (``None``: none), its
    decided ``experiments`` and what they were compared with (``compared_with``)."""
    start, end = champions
    if start is None or end is None or start.objective <= 0:
        return None
    keeps = tuple(
        compared[e.id] for e in experiments if e.status == Status.KEEP and e.id in compared
    )
    return Gain(
        start,
        end,
        ledger.experiment(start.experiment_id).objective,
        ledger.experiment(end.experiment_id).objective,
        keeps,
    )
