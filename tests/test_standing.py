"""bench/standing.py: the baselines paired with orchestrate by seed, across files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.standing import main, paired_row, read, row


def _run(landscape: str, method: str, seed: int, final: float) -> dict[str, Any]:
    return {
        "landscape": landscape,
        "method": method,
        "seed": seed,
        "final_pct": final,
        "pct_after": [90.0, final],
        "decided": 2,
        "boots_without_stuck_reboots": 3,
        "wrong_keeps": 0,
        "keeps_under_1pct": 0,
        "wrong_discards_ge5": 1,
        "true_gains_ge5_tried": 2,
        "keeps": 0 if final < 95.5 else 1,
        "first_reached": [0] * 101,  # a field the table does not read
    }


def _write(path: Path, runs: list[dict[str, Any]]) -> Path:
    path.write_text(json.dumps(runs))
    return path


def test_runs_from_several_files_are_paired_on_the_seeds_every_method_has(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ours = _write(
        tmp_path / "ours.json",
        [_run("bench/landscapes/x.yaml", "orchestrate", s, 95.0 + s) for s in range(4)],
    )
    theirs = _write(
        tmp_path / "theirs.json",
        # seed 3 has no baselines: it is left out of the pairing
        [
            _run("x", method, s, final)
            for s in range(3)
            for method, final in (("greedy-2%", 90.0 + s), ("optuna-tpe", 96.0), ("grid", 94.0 - s))
        ],
    )
    runs = read([ours, theirs])
    line = row(runs, "x")
    assert line is not None
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[:2] == ["x", "3"]  # three seeds paired, not four
    assert cells[2] == "96.0 ± 0.6"  # 95, 96, 97
    # against greedy: +5 on every seed, no spread: in bold
    assert cells[6] == "**+5.00 ± 0.00**"
    # against TPE: −1, 0, +1
    assert cells[7] == "+0.00 ± 0.58"
    # against grid: +1, +3, +5: beyond two standard errors, in bold
    assert cells[8] == "**+3.00 ± 1.15**"
    # TPE's 96 % reached after one experiment in two runs; the third counts budget + 1
    assert cells[9] == "1.3 (2/3)"
    assert cells[-2] == "3/6"
    # no keep: orchestrate's seed 0 (95 %), none of TPE's (96 %), all of grid's (94, 93, 92 %)
    assert cells[-1] == "1 / 0 / 3"
    stripped = tmp_path / "stripped.json"
    assert main([str(ours), str(theirs), "--strip", str(stripped)]) == 0
    table = capsys.readouterr().out
    kept = json.loads(stripped.read_text())
    assert len(kept) == 13 and all("first_reached" not in r for r in kept)
    assert main([str(stripped)]) == 0
    assert capsys.readouterr().out == table  # the stripped file gives the same table


def test_orchestrates_runs_are_paired_by_seed_against_another_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--before``: orchestrate's runs against those of the same seeds in another file (a
    seed only one file has is left out, and so are the other methods)."""
    before = _write(
        tmp_path / "before.json",
        [_run("x", "orchestrate", s, final) for s, final in enumerate((95.0, 94.0, 96.0, 90.0))]
        + [_run("x", "grid", 0, 80.0)],
    )
    after = _write(
        tmp_path / "after.json",
        [
            _run("bench/landscapes/x.yaml", "orchestrate", s, f)
            for s, f in enumerate((95.0, 96.0, 97.0))
        ]
        + [_run("x", "grid", 0, 99.0), _run("y", "orchestrate", 0, 90.0)],
    )
    line = paired_row(read([before]), read([after]), "x")
    assert line is not None
    cells = [c.strip() for c in line.strip("|").split("|")]
    # seeds 0–2: 95 → 95, 94 → 96, 96 → 97; seed 3 is before's only, grid's runs are not read
    assert cells[:4] == ["x", "3", "95.0 → 96.0", "+1.00 ± 0.58"]
    assert cells[4] == "1.50 → 1.50"  # 3 boots over 2 decided, each side
    # keeps: 94 % (under 95.5) keeps nothing in this fixture; 96 and 97 keep one each
    assert cells[5:] == ["1 → 2", "0 → 0", "0 → 0", "2 → 1", "1"]
    assert paired_row(read([before]), read([after]), "y") is None  # no seed in both
    assert main(["--before", str(before), str(after)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("| landscape | seeds | final %, before → after |")
    assert out[2] == line and len(out) == 3


def test_a_run_given_twice_with_another_result_is_refused(tmp_path: Path) -> None:
    one = _write(tmp_path / "one.json", [_run("x", "orchestrate", 0, 95.0)])
    same = _write(tmp_path / "same.json", [_run("x", "orchestrate", 0, 95.0)])
    other = _write(tmp_path / "other.json", [_run("x", "orchestrate", 0, 93.0)])
    assert len(read([one, same])) == 1
    with pytest.raises(SystemExit, match="different code"):
        read([one, other])


def test_a_file_that_is_no_research_json_is_one_line_naming_it(tmp_path: Path) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(SystemExit, match=r"broken\.json: cannot read it as JSON"):
        read([broken])
    with pytest.raises(SystemExit, match=r"missing\.json: cannot read it as JSON"):
        read([tmp_path / "missing.json"])
    table = tmp_path / "table.json"
    table.write_text(json.dumps({"far-k": 95.0}))
    with pytest.raises(SystemExit, match=r"table\.json: not a list of runs"):
        read([table])
    run = _run("x", "orchestrate", 0, 95.0)
    del run["pct_after"]
    short = _write(tmp_path / "short.json", [run])
    with pytest.raises(SystemExit, match=r"short\.json: run 0 lacks pct_after"):
        read([short])
