"""A champion as configured that does not boot is the profile's, not a verdict on a change:
the round stops with one line naming the failure and what to fix in ``champion:`` (exit 3),
bars nothing, and stays open; once the profile is fixed the same command resumes it and
measures the new champion. Real twin engines (one node, one short cell), the real round loop
and SQLite ledger; a launcher that exits at once through the real command line."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from agents import SweepProposer
from knobs.vocabulary import Kind, Status
from ledger import Ledger
from orchestrator.approval import ApprovalGate
from orchestrator.baseline import BaselineFailed
from orchestrator.display import RoundDisplay
from orchestrator.known_bad import barred_regions
from orchestrator.profile import Profile, load_profile
from orchestrator.round import RoundOptions, RoundReport, RoundRunner
from orchestrator.stops import last_stop
from orchestrator.testbed import ClusterTestbed, NullSink, deployer_for
from tests.fixtures.cli import orchestrate
from tests.fixtures.mlflow_store import MlflowStore
from tests.fixtures.profiles import twin_profile_data, write_profile


def one_node(memory: float) -> dict[str, Any]:
    """The twin profile on one node with one short cell; its champion's memory fraction
    ``memory`` (0.70 is too little KV cache for its max_model_len: ``kv_capacity``)."""
    data = twin_profile_data(nodes=1)
    argv = data["launcher"]["argv"]
    argv[argv.index("--tensor-parallel-size") + 1] = "1"
    data["gates"].update(clocks_command=None, recover_command=None)
    data["cells"] = data["cells"][:1]
    data["cells"][0].update(warmup_s=0.1, duration_s=0.3)
    data["verdict"] = {"policy": "threshold", "threshold_pct": 2.0}
    data["champion"]["gpu_memory_utilization"] = memory
    return data


def round_of(
    tmp_path: Path, data: dict[str, Any], said: io.StringIO | None = None
) -> tuple[Profile, RoundReport]:
    """One round of budget 1 under profile ``data`` on real twin engines (raises its stop);
    what it says, in ``said``."""
    prof = load_profile(str(write_profile(tmp_path, data)), base_dir=tmp_path)
    ledger = Ledger(f"sqlite:///{tmp_path}/orchestrate.db")
    deployer = deployer_for(prof)
    try:
        loop = RoundRunner(
            prof,
            ledger,
            NullSink(),
            ClusterTestbed(deployer, prof.cluster.base_url, prof.model),
            SweepProposer([{"num_speculative_tokens": 5}]),
            ApprovalGate(ledger, "auto"),
            RoundDisplay(Console(file=said or io.StringIO(), width=300)),
        )
        return prof, loop.run(RoundOptions(budget=1, proposer="sweep", approve="auto"))
    finally:
        deployer.teardown()
        deployer.close()
        ledger.close()


@pytest.mark.timeout(300)
def test_a_champion_that_cannot_boot_stops_the_round_as_the_profiles_and_resumes_once_fixed(
    tmp_path: Path,
) -> None:
    data = one_node(0.70)
    with pytest.raises(BaselineFailed) as stopped:
        round_of(tmp_path, data)
    assert stopped.value.exit_code == 3
    said = stopped.value.message
    assert said.startswith(
        "the profile's champion does not boot as configured: the baseline (experiment #1) "
        "failed for the config's own reason (kv_capacity: failed twice: kv_capacity, "
        "kv_capacity; node-0: engine exited"
    ), said
    assert "more KV cache memory is needed" in said
    assert "; a larger gpu_memory_utilization than 0.7 may boot" in said
    assert said.endswith(
        "; nothing was barred: fix champion: (or launcher:) in profile twin-test and run the "
        "same command again to resume round 1"
    ), said

    ledger = Ledger(f"sqlite:///{tmp_path}/orchestrate.db")
    prof = load_profile(str(tmp_path / "profile.yaml"), base_dir=tmp_path)
    rnd = ledger.unfinished_round("twin-local")
    assert rnd is not None and rnd.id == 1  # open: the same command resumes it
    (baseline,) = ledger.experiments(round_id=1)
    assert (baseline.kind, baseline.status, baseline.failure_class) == (
        Kind.BASELINE,
        Status.CRASH,
        "kv_capacity",
    )
    stop = last_stop(ledger, "twin-local", 1)
    assert stop is not None and stop.detail["exit_code"] == 3
    assert barred_regions(prof, ledger) == []
    ledger.close()
    env = {**os.environ, "ORCHESTRATE_LEDGER": f"sqlite:///{tmp_path}/orchestrate.db"}
    status = orchestrate(tmp_path, "status", "--profile", "profile.yaml", env=env)
    assert status.returncode == 0, status.stderr
    assert (
        "champion: none: the profile's champion did not boot as configured (experiment #1, "
        "kv_capacity); fix champion: in profile twin-test, then run `orchestrate round`"
    ) in status.stdout, status.stdout

    # the profile fixed: the same command resumes round 1 and measures the new champion
    data["champion"]["gpu_memory_utilization"] = 0.85
    shown = io.StringIO()
    _, report = round_of(tmp_path, data, shown)
    assert (
        "the champion as configured did not boot in experiment #1 (kv_capacity): champion: "
        "changed since, so the new one is measured"
    ) in shown.getvalue()
    assert report.resumed and report.round.id == 1 and report.stopped_by == "budget"
    first, second, change = report.experiments
    assert (first.status, second.kind, second.status) == (Status.CRASH, Kind.BASELINE, Status.KEEP)
    assert second.config["gpu_memory_utilization"] == 0.85
    assert change.kind == Kind.CANDIDATE and change.status is not None
    assert report.champion is not None


@pytest.mark.timeout(300)
def test_a_champion_whose_launcher_exits_at_once_ends_the_round_with_exit_3_and_one_line(
    cli_workdir: Path, mlflow_db: MlflowStore
) -> None:
    data = one_node(0.85)
    data["launcher"].update(
        argv=["{python}", "-c", "import sys; sys.exit('ValueError: no such model')"],
        head_argv=[],
    )
    write_profile(cli_workdir, data)
    ran = orchestrate(cli_workdir, "round", "--budget", "1", "--profile", "profile.yaml")
    assert ran.returncode == 3, ran.stderr
    last = ran.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "Error: the profile's champion does not boot as configured: the baseline (experiment "
        "#1) failed for the config's own reason (start: failed twice: start, start; node-0: "
    ), last
    assert "may boot" not in last, last  # no knob declares `start` monotone
    assert last.endswith("in profile twin-test and run the same command again to resume round 1")

    status = orchestrate(cli_workdir, "status", "--profile", "profile.yaml", "--json")
    assert status.returncode == 0, status.stderr
    seen = json.loads(status.stdout)
    assert seen["champion"] is None and seen["running_round"] is not None
    assert seen["champion_did_not_boot"] == {"experiment": 1, "failure_class": "start"}
