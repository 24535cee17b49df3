"""The champion's level in force against what its own row records, in a person's words.

A change's row (results.tsv, the report's table) records what its verdict measured; the
champion's level moves after that: its own boots after a keep, a confirmed drift re-based, its
launchers rendered anew (a knob's flag dropped), its keep's boots set aside. Verdicts compare
with the level in force (``ChampionEvidence.level``), so wherever the champion's row or its
objective is shown the difference is said: the row keeps its measurement (history is not
rewritten) and says the level in force; ``status`` shows the level and names the row's
measurement. One home for both sentences, so they agree.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ledger import Ledger
from orchestrator.champion import ChampionEvidence
from orchestrator.profile import Profile


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
        over = f" over {self.boots} boot(s)" if self.boots else ""
        return f"its level in force is {self.level:.2f}{over}, what changes are compared with"

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


def level_in_force(evidence: ChampionEvidence) -> LevelInForce | None:
    """The champion's level where it is not what its row records (``None``: no champion, or
    its level is its row's measurement)."""
    champion = evidence.fitted()
    if champion is None:
        return None
    row = evidence.ledger.experiment(champion.experiment_id)
    if row.objective is None or math.isclose(champion.objective, row.objective, rel_tol=1e-9):
        return None
    boots = sum(1 for m in evidence.level() if evidence.trusted(m))
    return LevelInForce(champion.experiment_id, row.objective, champion.objective, boots)


def row_notes(profile: Profile, ledger: Ledger) -> dict[int, str]:
    """What results.tsv adds to a row's description, by experiment: the champion's level in
    force (``LevelInForce.row_words``) where it was measured again since its verdict."""
    level = level_in_force(ChampionEvidence(profile, ledger))
    return {} if level is None else {level.experiment: level.row_words()}
