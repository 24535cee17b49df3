"""``bench/ledger_scale.py``: rounds one after another on one ledger, each row what a round
cost the loop per experiment, counted from the statements the ledger really sent."""

from __future__ import annotations

from pathlib import Path

from bench.ledger_scale import grow


def test_rounds_grow_one_ledger_and_each_row_counts_what_its_round_sent(tmp_path: Path) -> None:
    rows = grow(f"sqlite:///{tmp_path}/ledger.db", "flat", rounds=2, budget=3)
    assert [r["round"] for r in rows] == [0, 1]
    first, second = rows
    assert first["ledger_before"] == 0 and first["experiments"] == 4  # the baseline too
    assert second["ledger_before"] == 4 and second["experiments"] == 3
    for row in rows:
        assert row["stopped_by"] == "budget"
        assert row["statements_per_experiment"] > 0 and row["ms_per_experiment"] > 0
