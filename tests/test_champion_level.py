"""The champion's level in force against what its own row records (``champion_level``): its
row in results.tsv keeps what its verdict measured, and every place that shows the champion
(results.tsv's row, ``status``, the report, the round's last lines) says the level changes are
compared with, and that it was measured again. A real ledger an older release wrote, through
the CLI (a champion measured again for its rendering: ``test_profile_rendering``)."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

from ledger import Ledger
from orchestrator import left_open
from tests.fixtures.cli import orchestrate
from tests.test_migrations import CLUSTER, LEDGERS, _upgraded_release


def rows_of(text: str) -> dict[int, list[str]]:
    """results.tsv's rows, by experiment."""
    return {int(r.split("\t")[0]): r.split("\t") for r in text.splitlines()[1:]}


def test_an_old_ledger_s_champion_row_says_the_level_that_status_shows(tmp_path: Path) -> None:
    """Schema 7's champion, the baseline, was measured again after its verdict: its level is
    11184.7 (what ``status`` showed and changes were compared with) while results.tsv's row said
    10125.50 and nothing else. Now the row keeps 10125.50 and says the level in force; status
    shows the level and names the row's measurement; every other row is as the release
    exported it."""
    url, _ = _upgraded_release("schema7", tmp_path)
    shutil.copyfile(LEDGERS / "schema7.profile.yaml", tmp_path / "profile.yaml")
    env = {**os.environ, "ORCHESTRATE_LEDGER": url}
    with Ledger(url) as ledger:
        champion = ledger.champion(CLUSTER)
        assert champion is not None
        row = ledger.experiment(champion.experiment_id).objective
        assert row is not None and abs(champion.objective / row - 1) > 0.01
    level, kept = f"{champion.objective:.2f}", f"{row:.2f}"

    shown = orchestrate(tmp_path, "status", "-p", "profile.yaml", env=env)
    assert shown.returncode == 0, shown.stderr
    said = " ".join(shown.stdout.split())
    assert f"objective {champion.objective:.1f}" in said, said
    assert re.search(
        rf"measured again since its verdict: its level in force is {level} over \d+ boot\(s\), "
        rf"what changes are compared with; its row in results.tsv \(#{champion.experiment_id}\) "
        rf"keeps {kept}, what its verdict measured",
        said,
    ), said
    data = json.loads(
        orchestrate(tmp_path, "status", "--json", "-p", "profile.yaml", env=env).stdout
    )
    assert data["champion"]["objective"] == champion.objective
    assert data["champion"]["measured_again"]["row_objective"] == row

    exported = orchestrate(tmp_path, "export", "-", "-p", "profile.yaml", env=env)
    assert exported.returncode == 0, exported.stderr
    now, then = rows_of(exported.stdout), rows_of((LEDGERS / "schema7.results.tsv").read_text())
    mine = now.pop(champion.experiment_id)
    old = then.pop(champion.experiment_id)
    # its futility stop left open for another look reads inconclusive (``left_open``)
    opened, recorded = now.pop(4), then.pop(4)
    assert (opened[4], recorded[4]) == ("inconclusive", "discard")
    assert opened[7] == f"{recorded[7]}; {left_open.WORDS}"
    assert now == then  # every other row as the release exported it
    assert mine[:7] == old[:7] and mine[1] == kept  # its measurement stays recorded
    assert mine[7].startswith(
        f"{old[7]}; champion, measured again since: its level in force is {level} over "
    )
    assert f"(this row keeps {kept}, what its verdict measured)" in mine[7]


def test_cells_removed_or_added_since_the_champion_was_measured_are_said_with_its_objective(
    tmp_path: Path,
) -> None:
    """A profile that drops a cell after the champion was measured: the verdict compares with
    its level over the cells left, and ``status`` and the report showed the old cells' sum, the
    removal unsaid. Now they show the level over the cells of now and name the cell removed;
    a cell added is named, with the number shown said to be over the cells of then."""
    url, _ = _upgraded_release("schema7", tmp_path)
    env = {**os.environ, "ORCHESTRATE_LEDGER": url}
    text = (LEDGERS / "schema7.profile.yaml").read_text()
    agentic = next(line for line in text.splitlines() if "name: agentic-c4-8k" in line)
    (tmp_path / "profile.yaml").write_text(text.replace(agentic + "\n", ""))
    with Ledger(url) as ledger:
        champion = ledger.champion(CLUSTER)
        assert champion is not None
    data = json.loads(
        orchestrate(tmp_path, "status", "--json", "-p", "profile.yaml", env=env).stdout
    )
    shown = data["champion"]["objective"]
    assert shown < champion.objective * 0.97, (shown, champion.objective)  # three cells' sum
    assert data["champion"]["cells_changed"] == {
        "removed": ["agentic-c4-8k"],
        "added": [],
        "recorded_objective": champion.objective,
    }
    said = " ".join(orchestrate(tmp_path, "status", "-p", "profile.yaml", env=env).stdout.split())
    assert f"objective {shown:.1f}:" in said, said
    assert (
        f"the profile removed agentic-c4-8k since the champion was measured: its objective "
        f"{shown:.1f} is over the cells of now, what changes are compared with (the ledger's "
        f"{champion.objective:.1f} was over the cells of then)"
    ) in said, said
    report = orchestrate(tmp_path, "report", "--out", "out", "-p", "profile.yaml", env=env)
    assert report.returncode == 0, report.stderr
    page = " ".join((tmp_path / "out" / "report.html").read_text().split())
    assert "The profile removed agentic-c4-8k since the champion was measured" in page, page

    added = agentic.replace("agentic-c4-8k", "agentic-c2-8k").replace(
        "concurrency: 4", "concurrency: 2"
    )
    (tmp_path / "profile.yaml").write_text(text.replace(agentic, f"{agentic}\n{added}"))
    data = json.loads(
        orchestrate(tmp_path, "status", "--json", "-p", "profile.yaml", env=env).stdout
    )
    assert data["champion"]["objective"] == champion.objective
    assert data["champion"]["cells_changed"]["added"] == ["agentic-c2-8k"]
    said = " ".join(orchestrate(tmp_path, "status", "-p", "profile.yaml", env=env).stdout.split())
    assert (
        f"the profile added agentic-c2-8k since the champion was measured: its objective "
        f"{champion.objective:.1f} is over the cells of then; it has none over the cells of now "
        "until the next round measures it again"
    ) in said, said


def test_a_champion_whose_launchers_render_anew_has_no_level_in_force_in_status(
    tmp_path: Path,
) -> None:
    """A knob gained since the champion was measured renders a flag its boots lacked: status
    said "its level in force is …, what changes are compared with" and, on the next
    line, that its measurements are set aside and it is measured again first. It now says the
    level is of the launchers as they rendered then, set aside."""
    url, _ = _upgraded_release("schema9", tmp_path)
    text = (LEDGERS / "schema9.profile.yaml").read_text()
    gained = (
        "knobs:\n  - {name: max_num_seqs, type: int, low: 64, high: 512, step: 64, default: 256,\n"
        "     render: {kind: flag, flag: --max-num-seqs}}\n"
    )
    (tmp_path / "profile.yaml").write_text(text.replace("knobs:\n", gained, 1))
    env = {**os.environ, "ORCHESTRATE_LEDGER": url}
    shown = orchestrate(tmp_path, "status", "-p", "profile.yaml", env=env)
    assert shown.returncode == 0, shown.stderr
    said = " ".join(shown.stdout.split())
    assert "the champion is measured again before any change is judged against it" in said, said
    assert "its level in force is" not in said, said
    assert re.search(
        r"its last level, [\d.]+, is of its launchers as they rendered then, set aside: the "
        r"next round measures it again before any change is compared with it",
        said,
    ), said
