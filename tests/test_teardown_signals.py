"""A teardown that has begun finishes: a round stopped (Ctrl-C, SIGTERM) tears its boot down,
and a signal that arrives while the nodes are being stopped (the SSH session to this machine
closing: SIGHUP; a service manager's second SIGTERM; a person's second Ctrl-C) is held until
every engine is stopped and the boot closed, then ends the command as it would have (exit 130).
Before, it raised again inside the teardown: the nodes after the one being stopped kept their
engines, and the boot stayed open, until the next command.

Real processes: `orchestrate round` on a two-node twin, a SQLite ledger. The teardown is held
at the head's stop by the profile's own stop hook, which waits on a file while a latch file
exists, so that the second signal lands inside the teardown, not by luck.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from ledger import Ledger
from orchestrator.interrupts import HELD
from tests.fixtures.cli import orchestrate, watched
from tests.fixtures.profiles import twin_profile_data, write_profile
from tests.fixtures.wait import wait_until
from tests.test_round_twin import engines_alive

CLUSTER = "twin-local"

# while `hold` exists, a node's stop waits (after saying so) until `go` exists
HOOK = """#!/bin/sh
[ -e "$1/hold" ] || exit 0
touch "$1/stopping-$2"
while [ ! -e "$1/go" ]; do sleep 0.02; done
"""


def _signals_at_default() -> None:
    # Ctrl-C as at a terminal: a suite started in the background hands its children SIGINT
    # (and SIGHUP) ignored, and the round would never see them
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("ORCHESTRATE_LEDGER", f"sqlite:///{tmp_path}/orchestrate.db")
    monkeypatch.setenv("ORCHESTRATE_ARTIFACTS", str(tmp_path / "mlartifacts"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    yield tmp_path
    # whatever happened, no engine outlives the test (the latch opened first)
    (tmp_path / "go").touch()
    if engines_alive(tmp_path):
        orchestrate(tmp_path, "cluster", "down", "--force", "-p", "profile.yaml")


def _profile(root: Path) -> Path:
    hook = root / "hook.sh"
    hook.write_text(HOOK)
    data = twin_profile_data(nodes=2)
    argv = data["launcher"]["argv"]
    argv[argv.index("--tensor-parallel-size") + 1] = "2"
    data["gates"].update(
        clocks_command=None, recover_command=None, stop_hook=["sh", str(hook), str(root), "{rank}"]
    )
    data["cells"] = [c for c in data["cells"] if c["name"] in ("code-c1", "prose-c8")]
    for cell in data["cells"]:
        cell["warmup_s"] = 0.1
        cell["duration_s"] = 2.0  # long enough that the round is found mid-cell
    return write_profile(root, data)


def _quiet(pid: int) -> bool:
    """The process sent its output to /dev/null (what a SIGHUP does first)."""
    return os.readlink(f"/proc/{pid}/fd/2") == os.devnull


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (signal.SIGTERM, signal.SIGHUP),
        (signal.SIGTERM, signal.SIGTERM),
        (signal.SIGINT, signal.SIGINT),
    ],
    ids=["SIGTERM-then-SIGHUP", "SIGTERM-twice", "ctrl-c-twice"],
)
def test_a_signal_during_a_teardown_waits_for_every_node_and_the_boots_end(
    root: Path, first: signal.Signals, second: signal.Signals
) -> None:
    _profile(root)
    with watched(
        root, "round", "--budget", "1", "-p", "profile.yaml", preexec_fn=_signals_at_default
    ) as run:
        proc, out, err = run.proc, run.out, run.err
        wait_until("the baseline mid-cell", lambda: any("cell 1 of 2" in x for x in out), 180)
        (root / "hold").touch()
        proc.send_signal(first)
        # the teardown has begun: the head's stop waits on the latch
        wait_until("the head's stop", lambda: (root / "stopping-0").exists(), timeout=120)
        proc.send_signal(second)
        # the second signal seen (said, or the output gone to /dev/null), or the command ended
        name = "Ctrl-C" if second == signal.SIGINT else "SIGTERM"

        def seen() -> bool:
            if second == signal.SIGHUP:
                return _quiet(proc.pid)
            return any(x.startswith(f"{name} while the nodes") for x in err)

        wait_until("the second signal seen", lambda: proc.poll() is not None or seen(), 60)
        (root / "go").touch()
        code = proc.wait(timeout=120)
    said = "\n".join(out + err)
    assert code == 130, said
    assert "Traceback" not in said, said
    # every node was stopped, the one being stopped and the one after it
    assert engines_alive(root) == [], said
    assert (root / "stopping-1").exists(), said
    # … and the boot closed: nothing open for the morning's `status` to charge GPU-hours to
    with Ledger(os.environ["ORCHESTRATE_LEDGER"]) as ledger:
        assert ledger.open_boots(CLUSTER) == []
    if second != signal.SIGHUP:  # after a SIGHUP nothing reads the terminal: nothing is said
        held = [x for x in err if x.startswith(f"{name} while the nodes")]
        assert held == [HELD.format(name=name)], said
        assert [x for x in err if x.startswith("Error:")] == [
            "Error: interrupted; run the same command again to resume"
        ], said
    resumed = orchestrate(root, "round", "--budget", "1", "-p", "profile.yaml", "--json")
    assert resumed.returncode == 0, resumed.stderr
