"""results.tsv across a profile edit that removed or added a bench cell: the objective sums the
profile's cells, so rows before and after the edit are on other scales (two cells, then one:
a 45 % fall no config caused). The first row of the new cells says which cells its objective
sums, and the row before's (the review's G)."""

from __future__ import annotations

from pathlib import Path

from knobs.records import CellSpec
from ledger import Ledger
from orchestrator.compared_with import tsv_notes
from orchestrator.profile import load_profile
from tests.fixtures.profiles import write_profile
from tests.test_profile_evolution import CELL, profile_data
from tests.test_profile_evolution_under_way import round_of

PROSE = CellSpec(name="prose-c1", category="prose", concurrency=1)


def test_the_first_row_over_other_cells_says_which_its_objective_sums(tmp_path: Path) -> None:
    round_of(tmp_path, profile_data(), 1)
    both = {**profile_data(), "cells": [CELL.model_dump(), PROSE.model_dump()]}
    round_of(tmp_path, both, 1)
    profile = load_profile(str(write_profile(tmp_path, both)), base_dir=tmp_path)
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        notes = tsv_notes(profile, ledger)
        rows = [e for e in ledger.experiments() if e.objective is not None]
    said = {e: n for e, n in notes.items() if "sums cells" in n}
    # the first row measured over both cells (round 2's first), and none other
    first_of_both = next(e.id for e in rows if e.round_id == 2)
    assert list(said) == [first_of_both], (said, [(e.id, e.round_id) for e in rows])
    assert said[first_of_both].endswith(
        "its objective sums cells code-c1, prose-c1, the row before's code-c1: the profile's "
        "cells changed between them"
    ), said
