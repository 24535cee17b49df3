"""Another stack's profile under a ledger's cluster name (``orchestrator.stacks``). A profile
copied for a second stack with its ``cluster.name`` left as it was (or ``ORCHESTRATE_LEDGER``
pointing at another team's ledger) was answered, by ``status`` and ``round`` alike, with a knob
rename's advice (``new: true``), whose following grafts one stack onto the other's champion
history. It is now said for what it is, in one line, before any knob is compared; nothing is
written."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path
from typing import Any

import yaml

import orchestrator
from agents import SweepProposer
from ledger import Ledger
from tests.fixtures.cli import orchestrate
from tests.fixtures.profiles import write_profile
from tests.test_profile_evolution import profile_data
from tests.test_profile_evolution_under_way import round_of

#: the embedded profiles
PROFILES = Path(orchestrator.__file__).parent / "profiles"


def measured(tmp_path: Path) -> Path:
    """A round of the catalog's stack (model m, catalog vllm-dflash2) under cluster
    ``evolving``: cuda_graphs=false kept as its champion. The other stack's profile: the
    embedded vllm-cpu-smollm2 under the same cluster name."""
    round_of(tmp_path, profile_data(), 1, SweepProposer([{"cuda_graphs": False}]))
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        champion = ledger.champion("evolving")
        assert champion is not None and champion.config["cuda_graphs"] is False, champion
    other = yaml.safe_load((PROFILES / "vllm-cpu-smollm2.yaml").read_text())
    other["cluster"]["name"] = "evolving"
    return write_profile(tmp_path, other, "other.yaml")


def counts(tmp_path: Path) -> tuple[int, int, int]:
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        return (
            len(ledger.rounds("evolving")),
            len(ledger.experiments(cluster="evolving")),
            len(ledger.events("evolving")),
        )


def run(tmp_path: Path, *args: str) -> tuple[int, list[str]]:
    env = {**os.environ, "ORCHESTRATE_LEDGER": f"sqlite:///{tmp_path}/ledger.db"}
    env.pop("ORCHESTRATE_PROFILE", None)
    done = orchestrate(tmp_path, *args, env=env, timeout=60)
    return done.returncode, done.stderr.strip().splitlines()


def said(tmp_path: Path, theirs: str) -> str:
    return (
        f"Error: the ledger sqlite:///{tmp_path}/ledger.db holds cluster evolving as profile p "
        f"({theirs}); profile vllm-cpu-smollm2 (model smollm2) is another stack under the same "
        "cluster name: give it its own cluster.name, or use another ledger (ORCHESTRATE_LEDGER "
        "or the profile's ledger_url)"
    )


def test_another_stack_under_the_clusters_name_is_said_so_and_nothing_is_written(
    tmp_path: Path,
) -> None:
    other = measured(tmp_path)
    before = counts(tmp_path)
    line = said(tmp_path, "model m, catalog vllm-dflash2")
    for args in (["status"], ["round", "-n", "1"], ["known-bad", "list"]):
        rc, err = run(tmp_path, *args, "--profile", str(other))
        assert (rc, err) == (3, [line]), (args, rc, err)
    assert counts(tmp_path) == before
    # its own cluster name: a cluster of its own, which status shows (nothing run yet)
    data = yaml.safe_load(other.read_text())
    data["cluster"]["name"] = "smol"
    rc, err = run(tmp_path, "status", "--profile", str(write_profile(tmp_path, data, "own.yaml")))
    assert rc == 0, err
    # the same model served otherwise (a model path moved) is the profile's edit, no other stack
    edited: dict[str, Any] = profile_data()
    edited["launcher"] = {"argv": ["true", "--model", "/models/m-v2"]}
    rc, err = run(tmp_path, "status", "--profile", str(write_profile(tmp_path, edited, "e.yaml")))
    assert rc == 0, err
    assert counts(tmp_path) == before


def test_a_revision_an_earlier_release_recorded_is_compared_by_its_digests(
    tmp_path: Path,
) -> None:
    other = measured(tmp_path)
    # as a release before the model and the catalog were recorded by name wrote it
    with sqlite3.connect(tmp_path / "ledger.db") as db:
        changed = db.execute(
            "UPDATE event SET detail = json_remove(detail, '$.model', '$.knob_catalog') "
            "WHERE kind = 'profile-revised'"
        ).rowcount
    assert changed >= 1
    before = counts(tmp_path)
    line = said(tmp_path, "a model other than smollm2, recorded by digest, catalog vllm-dflash2")
    rc, err = run(tmp_path, "status", "--profile", str(other))
    assert (rc, err) == (3, [line]), (rc, err)
    assert counts(tmp_path) == before
    # the stack that ran it reads as before
    rc, err = run(tmp_path, "status", "--json", "--profile", str(tmp_path / "profile.yaml"))
    assert rc == 0, err


def test_status_under_another_stacks_profile_shows_what_the_ledger_holds_of_the_cluster(
    tmp_path: Path,
) -> None:
    """``status`` with another stack's profile said the one line round says, exit 3, and
    showed nothing of the ledger: whose cluster it is, whether a round of it runs now. It now
    shows, on stdout, what the ledger holds of that cluster as recorded (nothing read through
    the other stack's profile), then the same line and exit 3, as round (README: exit 3 for
    another stack's profile); ``--json`` gives it too. Nothing is written."""
    other = measured(tmp_path)
    before = counts(tmp_path)
    line = said(tmp_path, "model m, catalog vllm-dflash2")
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        champion = ledger.champion("evolving")
        (rnd,) = ledger.rounds("evolving")
    assert champion is not None
    env = {**os.environ, "ORCHESTRATE_LEDGER": f"sqlite:///{tmp_path}/ledger.db"}
    env.pop("ORCHESTRATE_PROFILE", None)
    done = orchestrate(tmp_path, "status", "--profile", str(other), env=env, timeout=60)
    assert (done.returncode, done.stderr.strip().splitlines()) == (3, [line]), done.stderr
    shown = " ".join(done.stdout.split())
    assert shown.startswith(
        "cluster evolving, as the ledger holds it (run as profile p, another stack than "
        "profile vllm-cpu-smollm2's): 1 round(s), "
    ), shown
    assert (
        f"champion: experiment #{champion.experiment_id}, objective {champion.objective:.1f} "
        "(cuda_graphs=false" in shown
    ), shown
    assert f"round {rnd.id} {rnd.status}" in shown, shown
    done = orchestrate(tmp_path, "status", "--json", "--profile", str(other), env=env, timeout=60)
    assert done.returncode == 3
    data = json.loads(done.stdout)
    assert data["another_stack"] == line.removeprefix("Error: "), data
    assert data["recorded"]["profile"] == "p"
    assert data["recorded"]["champion"]["experiment"] == champion.experiment_id, data
    assert counts(tmp_path) == before
