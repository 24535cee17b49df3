"""`orchestrate cluster down --force` under a round that is mid-cell: the command breaks the
round's claims and stops its engines, and the round stops at its next safe point (exit 8).
Before, nobody closed the round's boot: `status` said it was open, "left by a run that was
killed", its GPU-hours climbed with every node stopped, the resume "stopped engines left by an
interrupted run" (a resume does that only for an open boot), and the round's line said
"stopped before the next boot" of a round stopped mid-cell, without saying who broke its claim.

Real processes: `orchestrate round` on a two-node twin, `orchestrate cluster down --force`
beside it, a SQLite ledger.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from knobs.vocabulary import EventKind
from ledger import Ledger
from tests.fixtures.cli import orchestrate, watched
from tests.fixtures.profiles import long_cell_profile
from tests.fixtures.wait import wait_until
from tests.test_round_twin import engines_alive

CLUSTER = "twin-local"


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("ORCHESTRATE_LEDGER", f"sqlite:///{tmp_path}/orchestrate.db")
    monkeypatch.setenv("ORCHESTRATE_ARTIFACTS", str(tmp_path / "mlartifacts"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    long_cell_profile(tmp_path, duration_s=30.0)  # the round is found mid-cell
    yield tmp_path
    if engines_alive(tmp_path):
        orchestrate(tmp_path, "cluster", "down", "--force", "-p", "profile.yaml")


def _status(root: Path) -> dict[str, object]:
    said = orchestrate(root, "status", "-p", "profile.yaml", "--json")
    assert said.returncode == 0, said.stderr
    data: dict[str, object] = json.loads(said.stdout)
    return data


@pytest.mark.parametrize("whose", ["same", "another"])
def test_cluster_down_force_mid_cell_closes_the_rounds_boot_and_says_who(
    root: Path, whose: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """With the round's ledger, `cluster down --force` closes the boot it stopped and the
    round's line names it; with another ledger's (it cannot see the round's boot), the round
    closes its boot itself, as far as it knows who took its node."""
    other = tmp_path_factory.mktemp("other-ledger")
    env = (
        dict(os.environ)
        if whose == "same"
        else {**os.environ, "ORCHESTRATE_LEDGER": f"sqlite:///{other}/orchestrate.db"}
    )
    with watched(root, "round", "--budget", "1", "-p", "profile.yaml") as run:
        wait_until("the baseline mid-cell", lambda: any("cell 1 of 1" in x for x in run.out), 180)
        down = orchestrate(root, "cluster", "down", "--force", "-p", "profile.yaml", env=env)
        code = run.proc.wait(timeout=120)
    out, err = run.out, run.err
    said = "\n".join(out + err)
    assert down.returncode == 0, down.stdout + down.stderr
    assert "node-0: broke the claim of round of cluster twin-local" in down.stdout, down.stdout
    assert code == 8, said
    assert engines_alive(root) == [], said
    errors = [x for x in err if x.startswith("Error:")]
    assert len(errors) == 1, said
    [line] = errors
    # where the round was, and who broke its claim
    assert "lost its claim on the node" in line, line
    assert "mid-boot, during cell 1 of 1" in line, line
    assert "before the next boot" not in line, line
    if whose == "same":
        assert "`orchestrate cluster down --force`" in line, line
        assert f"pid {down_pid(os.environ['ORCHESTRATE_LEDGER'])}" in line, line
    assert "the experiment left undecided: run the same command to resume" in line, line

    # the boot is closed, naming the command that stopped its engines
    with Ledger(os.environ["ORCHESTRATE_LEDGER"]) as ledger:
        assert ledger.open_boots(CLUSTER) == []
        [e] = ledger.experiments(cluster=CLUSTER)
        [boot] = ledger.boots(e.id)
        assert boot.status == "down" and boot.ended_at is not None
    shown = orchestrate(root, "experiments", "show", str(e.id), "-p", "profile.yaml").stdout
    assert "cut short: its round lost the nodes: " in shown, shown
    assert "interrupted or killed" not in shown, shown
    if whose == "same":
        assert "`orchestrate cluster down --force`" in shown, shown

    # nothing accrues once the engines are stopped, and `status` says what happened
    first, second = _status(root), _status(root)
    assert first["open_boots"] == 0, first
    assert first["gpu_hours"] == second["gpu_hours"], (first, second)
    text = orchestrate(root, "status", "-p", "profile.yaml")
    assert "boot(s) open" not in text.stdout, text.stdout
    assert "run that was killed" not in text.stdout, text.stdout
    assert "lost its claim on the node" in text.stdout, text.stdout


def down_pid(url: str) -> int:
    """The pid of the `cluster down --force` that broke the round's claims, as recorded."""
    with Ledger(url) as ledger:
        events = ledger.events(CLUSTER, EventKind.CLAIM_BROKEN)
    assert events
    by = events[0].detail.get("by")
    assert isinstance(by, dict), events[0].detail
    pid = by["pid"]
    assert isinstance(pid, int)
    return pid
