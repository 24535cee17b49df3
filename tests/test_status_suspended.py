"""``orchestrate status`` while the round's process is suspended (SIGSTOP: Ctrl-Z, a laptop
asleep) past its lease: the round and the lease are said the same way — running, the lease
expired, its process alive and not renewing it — never "running (held by …)" beside "not
held". A real stopped process holds the lease of a real SQLite ledger; the real CLI reads it."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from knobs.vocabulary import Kind
from ledger import Ledger
from orchestrator.profile import load_profile
from tests.fixtures.cli import orchestrate
from tests.fixtures.profiles import twin_profile_data, write_profile


@pytest.fixture
def stopped() -> Iterator[subprocess.Popen[bytes]]:
    """A process of this host, stopped (SIGSTOP); killed afterwards."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    proc.send_signal(signal.SIGSTOP)
    yield proc
    proc.kill()
    proc.wait()


def test_a_suspended_rounds_status_says_its_lease_expired_and_its_process_lives(
    tmp_path: Path, stopped: subprocess.Popen[bytes]
) -> None:
    profile = str(write_profile(tmp_path, twin_profile_data()))
    env = {**os.environ, "ORCHESTRATE_LEDGER": f"sqlite:///{tmp_path}/orchestrate.db"}
    with Ledger(env["ORCHESTRATE_LEDGER"]) as ledger:
        rnd = ledger.create_round(
            cluster="twin-local", profile_name="twin-test", profile_digest="d", budget=2,
            proposer="optuna", approve="auto", seed=0,
        )  # fmt: skip
        # its baseline's boot open, as a round stopped mid-cell leaves it
        config = load_profile(profile).space.default_config()
        baseline = ledger.add_experiment(
            cluster="twin-local", round_id=rnd.id, kind=Kind.BASELINE, config=config,
            champion_key=None, champion_objective=None,
        )  # fmt: skip
        ledger.start_boot(baseline.id, config)
        # taken, then never renewed: expired a moment after (the CLI starts later than that)
        lease = ledger.acquire_lease(
            "twin-local", holder=f"{socket.gethostname()}:{stopped.pid}:feedbeef",
            hostname=socket.gethostname(), pid=stopped.pid, ttl_s=0.001,
            stale=lambda lease: False,
        )  # fmt: skip
    said = orchestrate(tmp_path, "status", "-p", profile, env=env)
    assert said.returncode == 0, said.stderr
    text = " ".join(said.stdout.split())
    expired = f"{lease.expires_at:%H:%M:%S} UTC"
    assert (
        f"round 1 running, but its lease expired at {expired} — its process (pid "
        f"{stopped.pid}) is alive and not renewing it (suspended?)"
    ) in text, text
    assert f"`orchestrate round --profile {profile}` takes the round over" in text, text
    assert "held by" not in text and "unfinished" not in text, text
    # its open boot is the suspended round's, never "left by a run that was killed" to stop
    assert "1 boot(s) open: the engines of the suspended round above" in text, text
    assert "killed" not in text and "cluster down` now" not in text, text
    assert f"lease: {lease.holder} expired at {expired} (not held: its process is alive" in text
    data = json.loads(orchestrate(tmp_path, "status", "--json", "-p", profile, env=env).stdout)
    assert (data["lease"]["held"], data["lease"]["state"]) == (False, "suspended")
    assert data["running_round"]["live"] is False
