"""`orchestrate cluster down` says what it found on each node: an engine it stopped, one that
had exited (with the head whose stop ended it, or before the command), or none. Before, a
worker that exited as its head stopped read `absent`, as a node where nothing ever ran.

Real processes: `cluster up` and `cluster down` on a three-node twin, a SQLite ledger.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.cli import orchestrate
from tests.fixtures.profiles import twin_profile_data, write_profile
from tests.fixtures.wait import wait_until
from tests.test_round_twin import engines_alive


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("ORCHESTRATE_LEDGER", f"sqlite:///{tmp_path}/orchestrate.db")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    data = twin_profile_data(nodes=3)
    argv = data["launcher"]["argv"]
    argv[argv.index("--tensor-parallel-size") + 1] = "3"
    data["gates"].update(clocks_command=None, recover_command=None)
    write_profile(tmp_path, data)
    try:
        up = orchestrate(tmp_path, "cluster", "up", "-p", "profile.yaml")
        assert up.returncode == 0, up.stdout + up.stderr
        assert [r for r in engines_alive(tmp_path) if r >= 0] == [0, 1, 2]
        yield tmp_path
    finally:  # an up that failed half way leaves no engine behind either
        if engines_alive(tmp_path):
            orchestrate(tmp_path, "cluster", "down", "-p", "profile.yaml")


def _down(root: Path) -> list[str]:
    down = orchestrate(root, "cluster", "down", "-p", "profile.yaml")
    assert down.returncode == 0, down.stdout + down.stderr
    assert engines_alive(root) == []
    return down.stdout.splitlines()


def test_workers_that_exit_as_the_head_stops_are_said_to_have_exited_with_it(root: Path) -> None:
    lines = _down(root)
    assert lines[0] == "node-0: stopped", lines
    # a worker exits once its head is gone: found so, or still going and stopped
    for rank, line in enumerate(lines[1:3], start=1):
        assert line in (
            f"node-{rank}: exited with the head (the head's stop ended it)",
            f"node-{rank}: stopped",
        ), lines
    again = _down(root)
    assert again == [f"node-{r}: absent (no engine of ours there)" for r in range(3)], again


def test_engines_that_exited_before_the_command_are_said_to_have_exited_then(
    root: Path,
) -> None:
    """The head killed from outside (a crash, the OOM killer): its workers follow it, and the
    morning's `cluster down` says each had exited before it, never that none was there."""
    pid = int((root / "nodes" / "node-0" / "engine.pid").read_text().split()[0])
    os.killpg(pid, signal.SIGKILL)
    wait_until("the workers to follow their head", lambda: engines_alive(root) == [], 60)
    lines = _down(root)
    # the head's wrapper died with it (no exit status written): when is not known
    assert lines[0] == "node-0: exited before this stop (nothing left to stop)", lines
    for rank, line in enumerate(lines[1:3], start=1):
        assert line.startswith(f"node-{rank}: exited "), lines
        assert line.endswith("s before this stop (nothing left to stop)"), lines
