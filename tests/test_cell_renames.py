"""A bench cell renamed under a ledger (``orchestrator.cell_renames``): its readings carry over
and the champion is not measured again. Before, a rename read as a cell removed and one added,
and cost a re-measure of the champion; a ``renamed_from:`` was refused as an unknown field."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from knobs.errors import ProfileError
from ledger import Ledger
from tests.fixtures.cli import orchestrate
from tests.fixtures.profiles import write_profile
from tests.test_profile_evolution import CELL, profile_data
from tests.test_profile_evolution_under_way import round_of

PROSE = {**CELL.model_dump(), "name": "prose-c2", "category": "prose", "concurrency": 2}


def cells(*first: dict[str, Any]) -> dict[str, Any]:
    """``profile_data()`` with cells ``first`` (default: code-c1) and prose-c2."""
    return {**profile_data(), "cells": [*(first or [CELL.model_dump()]), PROSE]}


def renamed(**fields: Any) -> dict[str, Any]:
    """code-c1 renamed code-1 (``fields`` on top)."""
    return cells({**CELL.model_dump(), "name": "code-1", **fields})


def measured(tmp_path: Path) -> None:
    """Three rounds under code-c1 and prose-c2: the champion measured enough that a round under
    the same cells does not measure it again."""
    for _ in range(3):
        round_of(tmp_path, cells(), 1)
    shown, bed = round_of(tmp_path, cells(), 1)
    assert "re-measuring the champion" not in shown and len(bed.boots) == 1, shown


def status_reads_no_cell_removed_or_added(tmp_path: Path) -> None:
    """``status --json`` under the profile of the last round: the champion's level over the
    cells of now, none removed or added, none redefined."""
    env = {**os.environ, "ORCHESTRATE_LEDGER": f"sqlite:///{tmp_path}/ledger.db"}
    done = orchestrate(tmp_path, "status", "--json", "-p", str(tmp_path / "profile.yaml"), env=env)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert (seen["champion"]["cells_changed"], seen["changed_cells"]) == (None, []), seen


def ledger_cells(tmp_path: Path, experiment: int) -> list[str]:
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        return [r.result.cell for r in ledger.cell_results(experiment)]


def test_a_cell_declared_renamed_keeps_its_readings_and_the_champion_is_not_measured_again(
    tmp_path: Path,
) -> None:
    measured(tmp_path)
    shown, bed = round_of(tmp_path, renamed(renamed_from="code-c1"), 1)
    assert "the profile changed since evolving last ran (p): cell code-c1 renamed code-1" in (
        shown
    ), shown
    assert "re-measuring the champion" not in shown, shown
    assert "removed code-c1" not in shown and "added code-1" not in shown, shown
    assert len(bed.boots) == 1  # the change's boot alone
    # nothing recorded is rewritten: the champion's readings keep the name of then
    assert set(ledger_cells(tmp_path, 1)) == {"code-c1", "prose-c2"}
    assert "code-1" not in ledger_cells(tmp_path, 1)
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        latest = max(e.id for e in ledger.experiments(cluster="evolving"))
    assert set(ledger_cells(tmp_path, latest)) == {"code-1", "prose-c2"}
    status_reads_no_cell_removed_or_added(tmp_path)


def test_a_cell_with_a_gone_cells_definition_is_read_as_renamed_and_said_once(
    tmp_path: Path,
) -> None:
    """No ``renamed_from``: code-1 is code-c1's definition in every measured field, and code-c1
    is gone. Before, the champion was measured again; now the round says the rename once and
    measures only the change, then and in the next round."""
    measured(tmp_path)
    shown, bed = round_of(tmp_path, renamed(), 1)
    assert (
        "cell code-1 is cell code-c1 renamed: the same definition in every measured field, and "
        "code-c1 is no longer in the profile; its readings carry over, nothing is measured "
        "again for it"
    ) in shown, shown
    assert "cell code-c1 renamed code-1" in shown, shown
    assert "re-measuring the champion" not in shown, shown
    assert len(bed.boots) == 1
    shown, bed = round_of(tmp_path, renamed(), 1)
    assert "code-c1" not in shown, shown  # said once
    assert "re-measuring the champion" not in shown and len(bed.boots) == 1, shown
    status_reads_no_cell_removed_or_added(tmp_path)


def test_a_cell_renamed_and_redefined_is_measured_again(tmp_path: Path) -> None:
    measured(tmp_path)
    shown, _ = round_of(tmp_path, renamed(renamed_from="code-c1", concurrency=4), 1)
    assert "cell code-c1 renamed code-1 and redefined (concurrency 1 → 4)" in shown, shown
    assert "re-measuring the champion" in shown, shown


def test_a_rename_from_a_cell_the_ledger_does_not_know_is_one_line_and_writes_nothing(
    tmp_path: Path,
) -> None:
    round_of(tmp_path, cells(), 1)
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        before = len(ledger.rounds("evolving"))
    with pytest.raises(ProfileError) as raised:
        round_of(tmp_path, renamed(renamed_from="code-c9"), 1)
    assert str(raised.value) == (
        "profile p: cell code-1 says renamed_from: code-c9, a cell the ledger has no reading of "
        "on cluster evolving (its cells: code-c1, prose-c2): write the name its readings were "
        "measured under, or take renamed_from out to measure code-1 as a new cell"
    )
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        assert len(ledger.rounds("evolving")) == before


def test_a_rename_from_a_cell_still_in_the_profile_is_refused_as_it_loads(tmp_path: Path) -> None:
    from orchestrator.profile import load_profile

    data = cells({**CELL.model_dump(), "renamed_from": "prose-c2"})
    with pytest.raises(ProfileError, match="renamed_from: prose-c2 is the name of cell prose-c2"):
        load_profile(str(write_profile(tmp_path, data)), base_dir=tmp_path)
