"""The record outlives the code (issue #17): a ledger written by an older release, under a
profile that has since gained a knob, opens with today's orchestrate and its next round
carries on from its champion, through the CLI as a user would run it.

The ledger is ``fixtures/ledgers/schema1.sqlite`` (written at c70919d on the embedded twin,
cluster ``twin-local``); the profile is the embedded twin's, with short cells and a knob the
old profile did not have.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from ledger import Ledger
from ledger.schema import head
from tests.fixtures.cli import orchestrate
from tests.fixtures.profiles import twin_profile_data, write_profile

LEDGERS = Path(__file__).parent / "fixtures" / "ledgers"
#: A knob the old profile did not have: rendered as an environment variable the twin ignores.
ADDED = {
    "name": "moe_backend",
    "new": True,
    "type": "choice",
    "choices": ["triton", "cutlass"],
    "default": "triton",
    "description": "added after the ledger was written",
    "render": {"kind": "env", "env": "MOE_BACKEND"},
}


def test_an_old_ledger_with_a_grown_profile_resumes_its_champion(tmp_path: Path) -> None:
    shutil.copyfile(LEDGERS / "schema1.sqlite", tmp_path / "orchestrate.db")
    env = {**os.environ, "ORCHESTRATE_LEDGER": f"sqlite:///{tmp_path}/orchestrate.db"}
    data = twin_profile_data()
    data["cluster"]["name"] = "twin-local"  # the cluster the old release recorded
    data["cells"] = data["cells"][:1]
    data["verdict"] = {"policy": "threshold", "threshold_pct": 2.0}
    data["proposer"] = {"kind": "sweep", "sweep": [{"num_speculative_tokens": 5}]}
    data["knobs"] = [*data["knobs"], ADDED]
    profile = write_profile(tmp_path, data)
    old = json.loads((LEDGERS / "schema1.status.json").read_text())

    status = orchestrate(tmp_path, "status", "--profile", str(profile), "--json", env=env)
    assert status.returncode == 0, status.stderr
    # the upgrade is said once, on stderr; stdout stays JSON
    assert f"upgraded the ledger's schema 0001 → {head()}" in status.stderr
    assert list(tmp_path.glob("orchestrate.db.*.bak"))
    now = json.loads(status.stdout)
    assert now["champion"]["experiment"] == old["champion"]["experiment"]
    # the old rounds' boots count as GPU-hours too (four twin nodes of one GPU each)
    assert now["gpu_hours"] > 0 and now["running_round"] is None
    # its verdicts recorded no acceptance counters: no step cost is learned from them
    assert now["step_cost"] is None

    # this test's MLflow store is not the one the old rounds logged to: said to be meant
    done = orchestrate(
        tmp_path, "round", "--budget", "1", "--new-mlflow-store", "--profile", str(profile),
        env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    said = " ".join((done.stdout + done.stderr).split())
    assert "profile gained knob moe_backend: the champion takes its default 'triton'" in said
    assert "upgraded the ledger's schema" not in said  # once only

    with Ledger(f"sqlite:///{tmp_path}/orchestrate.db") as ledger:
        rounds = ledger.rounds("twin-local")
        assert [r.status for r in rounds] == ["done", "done", "done"]
        new = ledger.experiments(round_id=rounds[-1].id)
        assert len(new) == 1 and new[0].knob == "num_speculative_tokens"
        assert new[0].config["moe_backend"] == "triton"
        assert new[0].id == max(e["experiment"] for e in _tsv(LEDGERS / "schema1.results.tsv")) + 1
    after = orchestrate(tmp_path, "status", "--profile", str(profile), "--json", env=env)
    assert json.loads(after.stdout)["gpu_hours"] > now["gpu_hours"]
    exported = orchestrate(tmp_path, "export", "-", "--profile", str(profile), env=env)
    assert exported.returncode == 0, exported.stderr
    # every old row as the old release exported it, the new experiment after them; the
    # champion's row, measured again since its verdict, adds the level in force to its
    # description (``champion_level``)
    old_tsv = (LEDGERS / "schema1.results.tsv").read_text().splitlines()
    lines = exported.stdout.splitlines()
    assert len(lines) == len(old_tsv) + 1
    with Ledger(f"sqlite:///{tmp_path}/orchestrate.db") as ledger:
        champion = ledger.champion("twin-local")
    assert champion is not None
    for line, was in zip(lines, old_tsv, strict=False):
        if line.split("\t")[0] == str(champion.experiment_id) and line != was:
            assert line.startswith(f"{was}; champion, measured again since: "), line
        else:
            assert line == was


def _tsv(path: Path) -> list[dict[str, int]]:
    lines = path.read_text().splitlines()[1:]
    return [{"experiment": int(line.split("\t")[0])} for line in lines]
