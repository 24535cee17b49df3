"""A node's claim lost mid-round with no breaker recorded: its claim folder removed (by hand,
a cleanup job, a reimaged node) or its files overwritten by another program. The round stops
where it stands, names the node, what it found there (no claim; another holder; a claim whose
files disagree) and when it found it, and says that nobody recorded breaking it. Nothing is
blamed on the config: the boot is closed as cut short by the lost node, the experiment left
undecided for the resume.

Real processes: `orchestrate round` on a two-node twin, a SQLite ledger, the claim's files
changed on the node's disk as another program would change them.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster.claims import CLAIM_DIR
from ledger import Ledger
from tests.fixtures.cli import orchestrate, watched
from tests.fixtures.processes import group_living
from tests.fixtures.profiles import long_cell_profile
from tests.fixtures.wait import wait_until
from tests.test_round_twin import engines_alive

CLUSTER = "twin-local"


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("ORCHESTRATE_LEDGER", f"sqlite:///{tmp_path}/orchestrate.db")
    monkeypatch.setenv("ORCHESTRATE_ARTIFACTS", str(tmp_path / "mlartifacts"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    monkeypatch.setenv("ORCHESTRATE_LEASE_TTL_S", "6")  # renewed every 2 s
    long_cell_profile(tmp_path, duration_s=60.0)  # the claim is lost mid-cell
    yield tmp_path
    if engines_alive(tmp_path):
        orchestrate(tmp_path, "cluster", "down", "--force", "-p", "profile.yaml")


def _removed(claim: Path) -> str:
    shutil.rmtree(claim)
    return "no claim is there any more"


def _taken(claim: Path) -> str:
    holder = json.loads((claim / "holder.json").read_text())
    holder.update(id="f" * 32, what="sweep", user="ops", hostname="elsewhere", pid=4242)
    (claim / "holder.json").write_text(json.dumps(holder) + "\n")
    (claim / "id").write_text("f" * 32 + "\n")
    return f"it is now claimed by sweep of cluster {CLUSTER} by ops@elsewhere (pid 4242)"


def _id_only(claim: Path) -> str:
    (claim / "id").write_text("e" * 32 + "\n")
    return f"its id file now reads {'e' * 32}, and its holder.json still names this round"


@pytest.mark.parametrize("change", [_removed, _taken, _id_only], ids=["removed", "taken", "id"])
def test_a_claim_lost_with_no_breaker_is_named_with_when_and_never_the_configs(
    root: Path, change: object
) -> None:
    with watched(root, "round", "--budget", "1", "-p", "profile.yaml") as run:
        wait_until("the baseline mid-cell", lambda: any("cell 1 of 1" in x for x in run.out), 180)
        found = change(root / "nodes" / "node-1" / CLAIM_DIR)  # type: ignore[operator]
        code = run.proc.wait(timeout=120)
    said = "\n".join(run.out + run.err)
    assert code == 8, said
    [line] = [x for x in run.err if x.startswith("Error:")]
    assert line.startswith(
        "Error: node-1 (127.0.0.1): this orchestrator lost its claim on the node"
    ), line
    assert found in line, line
    assert re.search(
        r"; found at \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC, last renewed at \d{4}-", line
    ), line
    assert "nobody recorded breaking it" in line, line
    assert "mid-boot, during cell 1 of 1" in line, line
    assert re.search(
        r"; it stopped the engines this boot started \(node-0: (stopped|killed), node-1: "
        r"(stopped|killed|already gone)\), each checked by its process group and start time",
        line,
    ), line
    assert "the experiment left undecided: run the same command to resume" in line, line
    with Ledger(os.environ["ORCHESTRATE_LEDGER"]) as ledger:
        assert ledger.open_boots(CLUSTER) == []
        [e] = ledger.experiments(cluster=CLUSTER)
        assert e.decided_at is None and e.status is None, e
        [boot] = ledger.boots(e.id)
        assert boot.failure_class is None, boot
        assert boot.status == "down" and boot.ended_at is not None
    shown = orchestrate(root, "experiments", "show", str(e.id), "-p", "profile.yaml").stdout
    assert "cut short: its round lost the nodes: " in shown, shown
    assert "nobody recorded breaking it" in shown, shown
    assert "the engines it started were stopped (node-0: " in shown, shown
    # what it says is so: no engine of the boot runs on through the night
    assert engines_alive(root) == [], said


def _start_time(pid: int) -> str:
    """Process ``pid``'s start time as the launcher records it (``/proc/PID/stat`` field 22)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]


def test_a_claim_taken_by_nobody_known_stops_this_boots_engines_and_nothing_of_the_new_holder(
    root: Path,
) -> None:
    """node-1's claim is taken by a holder nobody recorded, which has started an engine of
    its own in the node's workdir (its pid file names it now). The round stops exactly the
    engines its boot started, each by the process group and start time its start printed:
    the new holder's engine lives on, its pid file untouched, and the morning's `status`
    says what was stopped."""
    nodes = root / "nodes"
    with watched(root, "round", "--budget", "1", "-p", "profile.yaml") as run:
        wait_until("the baseline mid-cell", lambda: any("cell 1 of 1" in x for x in run.out), 180)
        ours = [
            int((nodes / n / "engine.pid").read_text().split()[0]) for n in ("node-0", "node-1")
        ]
        spawn = "setsid sleep 600 </dev/null >/dev/null 2>&1 & echo $!"
        theirs = int(subprocess.run(["bash", "-c", spawn], capture_output=True, text=True).stdout)
        try:
            (nodes / "node-1" / "engine.pid").write_text(f"{theirs} {_start_time(theirs)}\n")
            _taken(nodes / "node-1" / CLAIM_DIR)
            code = run.proc.wait(timeout=120)
            said = "\n".join(run.out + run.err)
            assert code == 8, said
            for pid in ours:
                assert group_living(pid) == [], pid
            os.killpg(theirs, 0)  # the new holder's engine: never signalled
            assert (nodes / "node-1" / "engine.pid").read_text().split()[0] == str(theirs)
            assert not (nodes / "node-1" / "engine.stopping").exists() or (
                (nodes / "node-1" / "engine.stopping").read_text().strip() != str(theirs)
            )
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(theirs, signal.SIGKILL)
    [line] = [x for x in run.err if x.startswith("Error:")]
    assert "it is now claimed by sweep of cluster" in line, line
    assert re.search(
        r"it stopped the engines this boot started \(node-0: (stopped|killed), node-1: "
        r"(stopped|killed|already gone)\)",
        line,
    ), line
    status = orchestrate(root, "status", "-p", "profile.yaml").stdout
    assert "it stopped the engines this boot started (node-0: " in status, status
