"""A profile that changes how the champion renders (a knob dropped, so its flag is no longer
passed): the champion is booted and measured again before a change is judged against it, and
its greedy reference taken again (``orchestrator.rendering``). Real rounds on the twin,
through the CLI, under two profiles against one ledger."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

from knobs.vocabulary import BootRole, Status
from ledger import Ledger
from orchestrator.known_bad import barred_regions
from orchestrator.profile import load_profile
from tests.fixtures.cli import orchestrate
from tests.fixtures.profiles import twin_profile_data, write_profile

CLUSTER = "g-twin"


def _profiles(tmp_path: Path) -> tuple[Path, Path]:
    """g.yaml: the embedded twin's profile, the champion measured on one boot; g2.yaml: the
    same with cuda_graphs untuned (its --enforce-eager no longer rendered: the engine runs
    with CUDA graphs on) and a sweep of a knob that does nothing on this landscape."""
    data: dict[str, Any] = twin_profile_data()
    data.update(name="g", verdict={"champion_boots": 1})
    data["cluster"]["name"] = CLUSTER
    dropped = copy.deepcopy(data)
    dropped.update(name="g2", untuned=["cuda_graphs"])
    del dropped["champion"]["cuda_graphs"]
    dropped["proposer"] = {"kind": "sweep", "sweep": [{"drafter_adapter_rank": 32}]}
    return write_profile(tmp_path, data, "g.yaml"), write_profile(tmp_path, dropped, "g2.yaml")


def test_a_dropped_knob_measures_the_champion_again_before_a_change_is_judged(
    tmp_path: Path,
) -> None:
    """Before, the rank change was judged against the champion's level and greedy texts of
    the eager launcher: `invalid objective 12010.5 (+17.54%) greedy outputs differ from the
    champion's on 32 prompt(s)`, and its region barred for good."""
    env = {**os.environ, "ORCHESTRATE_LEDGER": f"sqlite:///{tmp_path}/orchestrate.db"}
    g, g2 = _profiles(tmp_path)
    first = orchestrate(tmp_path, "round", "--budget", "1", "-p", str(g), env=env)
    assert first.returncode == 0, first.stderr[-3000:]
    with Ledger(env["ORCHESTRATE_LEDGER"]) as ledger:
        champion = ledger.champion(CLUSTER)
        assert champion is not None
        before = len(ledger.boots(champion.experiment_id))

    status = orchestrate(tmp_path, "status", "-p", str(g2), "--json", env=env)
    assert status.returncode == 0, status.stderr
    again = json.loads(status.stdout)["champion_measured_again"]
    assert again is not None and "knob cuda_graphs dropped" in again, again

    second = orchestrate(tmp_path, "round", "--budget", "1", "-p", str(g2), env=env)
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
