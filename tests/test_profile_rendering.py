"""A profile that changes how the champion renders (a knob dropped, so its flag is no longer
passed): the champion is booted and measured again before a change is judged against it, and
its greedy reference taken again (``orchestrator.rendering``). Real rounds on the twin,
through the CLI, under two profiles against one ledger."""

from __future__ import annotations

import copy
import io
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from rich.console import Console

from agents import SweepProposer
from knobs.config import Config
from knobs.records import CellResultRecord, CellSpec
from knobs.space import KnobSpace
from knobs.vocabulary import BootRole, State, Status
from ledger import Ledger
from orchestrator.approval import ApprovalGate
from orchestrator.display import RoundDisplay
from orchestrator.known_bad import barred_regions
from orchestrator.profile import load_profile
from orchestrator.round import RoundOptions, RoundRunner
from orchestrator.testbed import NullSink
from tests.fixtures.cli import orchestrate
from tests.fixtures.profiles import small_twin_profile_data, write_profile
from tests.test_champion_level import rows_of
from tests.test_profile_evolution import CELL, FOO, profile_data
from tests.test_profile_evolution_under_way import MNBT, KillingTestbed

CLUSTER = "g-twin"


def _profiles(tmp_path: Path) -> tuple[Path, Path]:
    """g.yaml: the embedded twin's profile on two nodes and one cell, the champion measured
    on one boot; g2.yaml: the same with cuda_graphs untuned (its --enforce-eager no longer
    rendered: the engine runs with CUDA graphs on) and a sweep of a knob that does nothing on
    this landscape."""
    data: dict[str, Any] = small_twin_profile_data()
    data.update(name="g", verdict={"champion_boots": 1})
    data["cluster"]["name"] = CLUSTER
    dropped = copy.deepcopy(data)
    dropped.update(name="g2", untuned=["cuda_graphs"])
    del dropped["champion"]["cuda_graphs"]
    dropped["proposer"] = {"kind": "sweep", "sweep": [{"drafter_adapter_rank": 32}]}
    return write_profile(tmp_path, data, "g.yaml"), write_profile(tmp_path, dropped, "g2.yaml")


def yaml_of(path: Path) -> dict[str, Any]:
    """A profile file's data."""
    data = yaml.safe_load(path.read_text())
    assert isinstance(data, dict)
    return data


@pytest.mark.timeout(900)  # three rounds on the twin through the CLI
def test_a_dropped_knob_measures_the_champion_again_before_a_change_is_judged(
    tmp_path: Path,
) -> None:
    """Before, the rank change was judged against the champion's level and greedy texts of
    the eager launcher: `invalid objective 12010.5 (+17.54%) greedy outputs differ from the
    champion's on 32 prompt(s)`, and its region barred for good."""
    env = {**os.environ, "ORCHESTRATE_LEDGER": f"sqlite:///{tmp_path}/orchestrate.db"}
    g, g2 = _profiles(tmp_path)
    first = orchestrate(tmp_path, "round", "--budget", "1", "-p", str(g), env=env, timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    with Ledger(env["ORCHESTRATE_LEDGER"]) as ledger:
        champion = ledger.champion(CLUSTER)
        assert champion is not None
        before = len(ledger.boots(champion.experiment_id))

    status = orchestrate(tmp_path, "status", "-p", str(g2), "--json", env=env)
    assert status.returncode == 0, status.stderr
    again = json.loads(status.stdout)["champion_to_measure_again"]
    assert again is not None and "knob cuda_graphs dropped" in again, again

    second = orchestrate(tmp_path, "round", "--budget", "1", "-p", str(g2), env=env, timeout=600)
    assert second.returncode == 0, second.stderr[-3000:]
    said = " ".join((second.stdout + second.stderr).split())
    assert "knob cuda_graphs is no longer in the profile" in said, said
    assert (
        "the champion is measured again before any change is judged against it: its launchers "
        "render differently now than when it was measured (knob cuda_graphs dropped, its flag "
        "no longer passed)"
    ) in said, said

    with Ledger(env["ORCHESTRATE_LEDGER"]) as ledger:
        rounds = ledger.rounds(CLUSTER)
        [change] = ledger.experiments(round_id=rounds[-1].id)
        assert change.knob == "drafter_adapter_rank" and change.value == 32
        assert change.status not in (Status.INVALID, Status.CRASH), ledger.verdict(change.id)
        barred = barred_regions(load_profile(str(g2)), ledger)
        assert [b for b in barred if b.experiment.id == change.id] == []
        boots = ledger.boots(champion.experiment_id)
        # booted again under the new rendering, before the change was decided
        later = boots[before:]
        assert later and later[0].role == BootRole.REMEASURE
        assert later[0].rendering is not None and later[0].rendering != boots[0].rendering
        level_then = champion.objective
        booted = len(boots)
    _says_its_new_level(tmp_path, g2, second.stdout, env)

    # the knob put back as it was: the first measurement renders as now and is the level again;
    # nothing is said to be measured again, and the champion's objective is that level's
    # (before: the line said so at every round and status, nothing was booted, and the
    # objective stayed the set-aside measurement's)
    back = write_profile(
        tmp_path,
        {**yaml_of(g), "proposer": {"kind": "sweep", "sweep": [{"drafter_adapter_rank": 16}]}},
        "g3.yaml",
    )
    third = orchestrate(tmp_path, "round", "--budget", "1", "-p", str(back), env=env, timeout=600)
    assert third.returncode == 0, third.stderr[-3000:]
    said = " ".join((third.stdout + third.stderr).split())
    assert "profile gained knob cuda_graphs" in said, said
    assert "the champion is measured again" not in said, said
    status = orchestrate(tmp_path, "status", "-p", str(back), "--json", env=env)
    assert json.loads(status.stdout)["champion_to_measure_again"] is None
    with Ledger(env["ORCHESTRATE_LEDGER"]) as ledger:
        now = ledger.champion(CLUSTER)
        assert now is not None and now.experiment_id == champion.experiment_id
        remeasured = [
            b for b in ledger.boots(champion.experiment_id)[booted:] if b.role == BootRole.REMEASURE
        ]
        if not remeasured:  # no drift check in between: the first measurement's level
            assert now.objective == pytest.approx(level_then, rel=1e-9)


def _says_its_new_level(tmp_path: Path, g2: Path, ended: str, env: dict[str, str]) -> None:
    """The champion measured again for its rendering: verdicts compare with the new level.
    Before, results.tsv's row showed the old rendering's objective and said nothing, nor did
    the report; the row keeps its measurement and says the level in force, as status, the
    report and the round's last lines (``ended``) do (``champion_level``)."""
    with Ledger(env["ORCHESTRATE_LEDGER"]) as ledger:
        champion = ledger.champion(CLUSTER)
        assert champion is not None
        row = ledger.experiment(champion.experiment_id).objective
        [change] = ledger.experiments(round_id=ledger.rounds(CLUSTER)[-1].id)
        verdict = ledger.verdict(change.id)
    assert row is not None and verdict is not None
    compared = verdict.stats["champion_objective"]  # the new level, not the row's
    assert isinstance(compared, float) and abs(compared / row - 1) > 0.05
    words = f"its level in force is {champion.objective:.2f} over "
    kept = f"{row:.2f}, what its verdict measured"
    assert f"measured again since its verdict: {words}" in " ".join(ended.split()), ended
    exported = orchestrate(tmp_path, "export", "-", "-p", str(g2), env=env)
    mine = rows_of(exported.stdout)[champion.experiment_id]
    assert mine[1] == f"{row:.2f}", mine  # its measurement stays recorded
    assert f"champion, measured again since: {words}" in mine[7], mine
    assert f"(this row keeps {kept})" in mine[7], mine
    shown = " ".join(orchestrate(tmp_path, "status", "-p", str(g2), env=env).stdout.split())
    assert f"measured again since its verdict: {words}" in shown, shown
    assert f"keeps {kept}" in shown, shown
    page = " ".join((tmp_path / "reports" / "round-2" / "report.html").read_text().split())
    assert f"The champion, measured again since its verdict: {words}" in page


# ---- a measurement cut by a kill and continued under another rendering ------------------
PROSE = CellSpec(name="prose-c1", category="prose", concurrency=1)


class CutTestbed(KillingTestbed):
    """``KillingTestbed`` that is Ctrl-C'd as a config ``cut`` picks benches its second cell
    (its first cell recorded: a measurement left unfinished)."""

    def __init__(self, space: KnobSpace, cut: Callable[[Config], bool]) -> None:
        super().__init__(space)
        self.cut = cut
        self.config: Config | None = None
        self.benched = 0

    def deploy(self, config: Config) -> dict[int, str]:
        self.config, self.benched = config, 0
        return super().deploy(config)

    def bench(self, cell: CellSpec) -> CellResultRecord:
        self.benched += 1
        if self.benched == 2 and self.config is not None and self.cut(self.config):
            raise KeyboardInterrupt
        return super().bench(cell)


def _round(tmp_path: Path, data: dict[str, Any], testbed: Callable[[KnobSpace], Any]) -> str:
    profile = load_profile(str(write_profile(tmp_path, data)), base_dir=tmp_path)
    shown = io.StringIO()
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        RoundRunner(
            profile,
            ledger,
            NullSink(),
            testbed(profile.space),
            SweepProposer([{MNBT: 6144}]),
            ApprovalGate(ledger, "auto"),
            RoundDisplay(Console(file=shown, width=300)),
        ).run(RoundOptions(budget=1, proposer="sweep", approve="auto"))
    return " ".join(shown.getvalue().split())


def test_a_measurement_cut_and_continued_under_another_rendering_starts_a_new_one(
    tmp_path: Path,
) -> None:
    """Ctrl-C as the change MNBT 7168 → 6144 benches its second cell, under a profile with
    knob foo (rendered --foo); the profile then loses foo. Before, the resume continued the
    change's measurement: its first cell read with --foo and its second without, one
    measurement across two launchers. Now the cut measurement is set aside and the change is
    measured afresh, every cell under the launcher it renders now."""
    with_foo = profile_data({**FOO, "new": True})
    with_foo["cells"] = [CELL.model_dump(), PROSE.model_dump()]
    with pytest.raises(KeyboardInterrupt):
        _round(tmp_path, with_foo, lambda space: CutTestbed(space, lambda c: c[MNBT] == 6144))
    without = {**profile_data(), "cells": with_foo["cells"]}
    _round(tmp_path, without, lambda space: KillingTestbed(space))
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        _, change = ledger.experiments(cluster="evolving")
        assert change.knob == MNBT and change.state == State.DECIDED
        boots = ledger.boots(change.id)
        assert [b.measurement for b in boots] == [0, 1]
        assert boots[0].rendering != boots[1].rendering
        readings = ledger.cell_results(change.id)
        assert sorted((r.boot_id, r.result.cell) for r in readings) == [
            (boots[0].id, "code-c1"),
            (boots[1].id, "code-c1"),
            (boots[1].id, "prose-c1"),
        ]
