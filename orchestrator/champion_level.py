"""The champion's level in force against what its own row records, in a person's words.

A change's row (results.tsv, the report's table) records what its verdict measured; the
champion's level moves after that: its own boots after a keep, a confirmed drift re-based, its
launchers rendered anew (a knob's flag dropped), its keep's boots set aside. Verdicts compare
with the level in force (``ChampionEvidence.level``), so wherever the champion's row or its
objective is shown the difference is said: the row keeps its measurement (history is not
rewritten) and says the level in force; ``status`` shows the level and names the row's
measurement. One home for both sentences, so they agree.

A profile may remove or add bench cells under a champion measured on the cells of then. A
measurement counts only the cells the profile has now (``measurements``), so the level changes
are compared with is over those; the objective the ledger records for the champion is over the
cells of then until it is measured again. Wherever the champion's objective is shown (the
round's last lines, ``status``, the report) it is its level over the cells of now, and which
cells were removed or added since is said (``CellsChanged``); with a cell added it has no level
over them until the next round measures it, and the number shown is said to be over the cells
of then.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ledger import ChampionRecord, Ledger
from orchestrator.cell_renames import resolved
from orchestrator.champion import ChampionEvidence
from orchestrator.profile import Profile
from orchestrator.verdict import objective, objective_of


@dataclass(frozen=True)
class LevelInForce:
    """The champion's level, measured again since the verdict its row records."""

    experiment: int
    #: what its row records: the objective its verdict measured
    measured: float
    #: the level in force, which changes are compared with
    level: float
    #: the trusted boots of that level (0: none yet under the launchers as they render now)
    boots: int

    def _level(self) -> str:
        if not self.boots:
            # no boot of it as its launchers render now (a knob gained or dropped, a flag
            # changed): its last level is not what the next change is compared with
            return (
                f"its last level, {self.level:.2f}, is of its launchers as they rendered then, "
                "set aside: the next round measures it again before any change is compared "
                "with it"
            )
        return (
            f"its level in force is {self.level:.2f} over {self.boots} boot(s), what changes "
            "are compared with"
        )

    def row_words(self) -> str:
        """What the champion's row says after its description (results.tsv, the report's
        table)."""
        return (
            f"champion, measured again since: {self._level()} (this row keeps "
            f"{self.measured:.2f}, what its verdict measured)"
        )

    def words(self) -> str:
        """What ``status`` and the report say of the champion: its level, and its row's."""
        return (
            f"measured again since its verdict: {self._level()}; its row in results.tsv "
            f"(#{self.experiment}) keeps {self.measured:.2f}, what its verdict measured"
        )

    def as_json(self) -> dict[str, object]:
        """For ``status --json``."""
        return {"row_objective": self.measured, "level_boots": self.boots}


@dataclass(frozen=True)
class CellsChanged:
    """The bench cells the profile removed and added since the champion was last measured."""

    removed: tuple[str, ...]
    added: tuple[str, ...]
    #: the objective the ledger records for the champion: over the cells of then
    recorded: float
    #: its level over the cells the profile has now (``None``: a cell added, not measured yet)
    level: float | None

    def words(self) -> str:
        """What ``status``, the round's last lines and the report say of it."""
        what = [f"removed {', '.join(self.removed)}"] if self.removed else []
        what += [f"added {', '.join(self.added)}"] if self.added else []
        since = f"the profile {' and '.join(what)} since the champion was measured"
        if self.level is None:
            return (
                f"{since}: its objective {self.recorded:.1f} is over the cells of then; it has "
                "none over the cells of now until the next round measures it again, before a "
                "change is judged against it"
            )
        return (
            f"{since}: its objective {self.level:.1f} is over the cells of now, what changes "
            f"are compared with (the ledger's {self.recorded:.1f} was over the cells of then)"
        )

    def as_json(self) -> dict[str, object]:
        """For ``status --json``."""
        return {
            "removed": list(self.removed),
            "added": list(self.added),
            "recorded_objective": self.recorded,
        }


def cells_changed(evidence: ChampionEvidence) -> CellsChanged | None:
    """The cells the profile removed and added since the champion's last measurement (its
    readings, against the profile's cells by name; a cell redefined is neither: ``
    measurements.changed_cells``); ``None``: no champion, none measured, or the same cells."""
    champion = evidence.fitted()
    if champion is None:
        return None
    ledger = evidence.ledger
    measurement = {b.id: b.measurement for b in ledger.boots(champion.experiment_id)}
    readings = [
        (measurement.get(r.boot_id, -1), r.result.cell)
        for r in ledger.cell_results(champion.experiment_id)
    ]
    if not readings:
        return None
    last = max(m for m, _ in readings)
    # a cell renamed (``cell_renames``) is neither removed nor added
    renamed = {c.renamed_from: c.name for c in evidence.profile.cells if c.renamed_from}
    then = list(dict.fromkeys(renamed.get(cell, cell) for m, cell in readings if m == last))
    now = [c.name for c in evidence.profile.cells]
    removed = tuple(c for c in then if c not in now)
    added = tuple(c for c in now if c not in then)
    if not removed and not added:
        return None
    level = evidence.level() if not added else []
    return CellsChanged(
        removed,
        added,
        champion.objective,
        objective_of([objective(m.cells) for m in level]) if level else None,
    )


def shown(evidence: ChampionEvidence) -> tuple[ChampionRecord | None, CellsChanged | None]:
    """The champion as it is shown (fitted), its objective its level over the profile's cells
    of now where the profile removed cells since it was measured, and what changed of them."""
    champion = evidence.fitted()
    cells = cells_changed(evidence)
    if champion is None or cells is None or cells.level is None:
        return champion, cells
    return champion.model_copy(update={"objective": cells.level}), cells


def level_in_force(evidence: ChampionEvidence) -> LevelInForce | None:
    """The champion's level where it is not what its row records (``None``: no champion, its
    level is its row's measurement, or it has none over the profile's cells of now)."""
    champion, cells = shown(evidence)
    if champion is None or (cells is not None and cells.level is None):
        return None
    row = evidence.ledger.experiment(champion.experiment_id)
    if row.objective is None or math.isclose(champion.objective, row.objective, rel_tol=1e-9):
        return None
    boots = sum(1 for m in evidence.level() if evidence.trusted(m))
    return LevelInForce(champion.experiment_id, row.objective, champion.objective, boots)


def row_notes(profile: Profile, ledger: Ledger) -> dict[int, str]:
    """What results.tsv adds to a row's description, by experiment: the champion's level in
    force (``LevelInForce.row_words``) where it was measured again since its verdict."""
    profile, _ = resolved(profile, ledger)  # a cell renamed: its readings its own
    level = level_in_force(ChampionEvidence(profile, ledger))
    return {} if level is None else {level.experiment: level.row_words()}
