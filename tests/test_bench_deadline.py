"""The bench's token deadline is the profile's (``bench.hang_after_s``): how long a cell
waits past its warm-up for an engine's first or next token before it calls the engine hung.
It was a fixed minute, too short for a 70B model's first token after a cold start and what
every test of a hung engine waited out. A profile that leaves it out gets the minute, as every
profile written before it did; a value that is no duration is refused in one line; and
``orchestrate bench`` fails a silent engine's cell by it, naming the setting to raise.

Real processes: ``cluster up`` and ``bench`` on a one-node twin, a SQLite ledger.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster.bench import cold_start_limit_s
from cluster.launcher import PIDFILE
from knobs.errors import ProfileError
from orchestrator.profile import load_profile
from tests.fixtures.cli import orchestrate
from tests.fixtures.profiles import twin_profile_data, write_profile
from tests.test_migrations import _upgraded_release
from tests.test_profile_upgrade import release_profile, revised, round_under
from tests.test_round_twin import engines_alive


def test_a_profile_without_a_bench_section_waits_the_minute_it_always_did(
    tmp_path: Path,
) -> None:
    data = twin_profile_data(nodes=1)
    data.pop("bench", None)
    prof = load_profile(str(write_profile(tmp_path, data)), base_dir=tmp_path)
    assert prof.bench.hang_after_s == 60.0
    cell = prof.cells[0]  # a short cell: the minute is its deadline
    assert cold_start_limit_s(cell, prof.bench.hang_after_s) == 60.0
    assert cold_start_limit_s(cell) == 60.0


def test_a_profile_sets_the_token_deadline_and_a_long_cell_still_waits_five_of_itself(
    tmp_path: Path,
) -> None:
    data = twin_profile_data(nodes=1)
    data["bench"] = {"hang_after_s": 300}
    prof = load_profile(str(write_profile(tmp_path, data)), base_dir=tmp_path)
    assert prof.bench.hang_after_s == 300.0
    assert cold_start_limit_s(prof.cells[0], prof.bench.hang_after_s) == 300.0
    long = prof.cells[0].model_copy(update={"warmup_s": 10.0, "duration_s": 90.0})
    assert cold_start_limit_s(long, 5.0) == 500.0


@pytest.mark.parametrize("value", [0, -5, 7200, "soon"])
def test_a_token_deadline_that_is_no_duration_is_refused_in_one_line(
    tmp_path: Path, value: object
) -> None:
    data = twin_profile_data(nodes=1)
    data["bench"] = {"hang_after_s": value}
    with pytest.raises(ProfileError) as refused:
        load_profile(str(write_profile(tmp_path, data)), base_dir=tmp_path)
    message = refused.value.message
    assert "\n" not in message, message
    assert "bench.hang_after_s" in message, message


def test_a_bench_key_the_section_lacks_is_refused(tmp_path: Path) -> None:
    data = twin_profile_data(nodes=1)
    data["bench"] = {"hang_after": 5}
    with pytest.raises(ProfileError) as refused:
        load_profile(str(write_profile(tmp_path, data)), base_dir=tmp_path)
    assert "bench.hang_after" in refused.value.message, refused.value.message
    assert "did you mean hang_after_s" in refused.value.message, refused.value.message


def test_a_token_deadline_changed_between_rounds_is_said_by_key_and_redefines_no_cell(
    tmp_path: Path,
) -> None:
    """Upgraded from a release before the setting (its ledger's profile has no ``bench``
    section), a round under the same file says no change; one under the deadline raised says
    it by key, and measures the champion again for nothing: the setting decides when a stall
    is a hang, not what a cell measures, so readings taken before count as they were."""
    url, _ = _upgraded_release("schema9s", tmp_path)
    shown = round_under(tmp_path, url, release_profile())
    assert "the profile changed" not in shown, shown
    raised = {**release_profile(), "bench": {"hang_after_s": 300}}
    shown = round_under(tmp_path, url, raised)
    assert "(twin): bench.hang_after_s 60.0 → 300.0" in shown, shown
    assert "redefined" not in shown and "measured again before" not in shown, shown
    [*_, now] = revised(url)
    assert now["settings"]["bench.hang_after_s"] == 300.0
    assert all("hang_after_s" not in cell for cell in now["cells"]), now["cells"]


@pytest.fixture
def up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A one-node twin whose profile sets a 3-s token deadline, up."""
    monkeypatch.setenv("ORCHESTRATE_LEDGER", f"sqlite:///{tmp_path}/orchestrate.db")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    data = twin_profile_data(nodes=1)
    argv = data["launcher"]["argv"]
    argv[argv.index("--tensor-parallel-size") + 1] = "1"
    data["gates"].update(clocks_command=None, recover_command=None)
    data["cells"] = data["cells"][:1]
    data["bench"] = {"hang_after_s": 3}
    write_profile(tmp_path, data)
    try:
        started = orchestrate(tmp_path, "cluster", "up", "-p", "profile.yaml")
        assert started.returncode == 0, started.stdout + started.stderr
        yield tmp_path
    finally:
        pidfile = tmp_path / "nodes" / "node-0" / PIDFILE
        if pidfile.exists():
            os.killpg(int(pidfile.read_text().split()[0]), signal.SIGCONT)
        orchestrate(tmp_path, "cluster", "down", "-p", "profile.yaml")
        assert engines_alive(tmp_path) == []


def test_orchestrate_bench_fails_a_silent_engines_cell_by_the_profiles_deadline(
    up: Path,
) -> None:
    """The head engine stopped (SIGSTOP: its connections open, nothing answered): the cell
    fails once the profile's deadline has passed (its short cell waits five times itself, 4 s),
    not after the minute, and its line names the setting to raise."""
    prof = load_profile(str(up / "profile.yaml"), base_dir=up)
    limit = cold_start_limit_s(prof.cells[0], prof.bench.hang_after_s)
    assert limit < 10
    pid = (up / "nodes" / "node-0" / PIDFILE).read_text().split()[0]
    os.killpg(int(pid), signal.SIGSTOP)
    started = time.monotonic()
    bench = orchestrate(up, "bench", "-p", "profile.yaml", timeout=120)
    took = time.monotonic() - started
    assert bench.returncode != 0, bench.stdout + bench.stderr
    said = bench.stderr
    assert "no token after the warm-up; waiting up to" in said, said
    assert "measured nothing: no token arrived in the window, nor in the " in said, said
    waited = float(said.split("nor in the ")[1].split("s ")[0])
    assert limit - 2 <= waited <= limit + 5, said
    assert "bench.hang_after_s" in said.split("nor in the ")[1], said
    assert took < limit + 40, f"bench took {took:.0f}s of a {limit:g}s deadline"
