"""``orchestrate experiments veto`` as a real process on a real SQLite ledger: a change whose
boots fail only for the infrastructure's reasons stops the round at every resume; a person
vetoes it (their words, who, its boots kept, a known-bad region like a proposal's veto), and
the same round command then goes on with the next change. Refused while a round holds the
cluster, for a decided experiment and for the baseline, each in one line."""

from __future__ import annotations

import getpass
import io
import json
import os
import socket
from pathlib import Path
from typing import Any

import pytest
import yaml
from mlflow.tracking import MlflowClient
from rich.console import Console

from agents import SweepProposer
from knobs.vocabulary import BootStatus, Kind, State, Status
from ledger import Ledger
from ledger.mlflow_sink import MlflowSink
from orchestrator.approval import ApprovalGate
from orchestrator.display import RoundDisplay
from orchestrator.faults import InfrastructureFault
from orchestrator.lease import ClusterLease
from orchestrator.profile import load_profile
from orchestrator.round import RoundOptions, RoundReport, RoundRunner
from tests.fixtures.cli import orchestrate
from tests.fixtures.mlflow_store import MlflowStore
from tests.test_config_failures import Failing
from tests.test_known_bad_cli import PROFILE, listed, write_scripted_profile

CHANGES: list[dict[str, Any]] = [
    {"num_speculative_tokens": 5},
    {"num_speculative_tokens": 6},
    {"max_num_batched_tokens": 4096},
]


def no_retries(directory: Path) -> None:
    """The scripted profile with no infrastructure retries: the first failure stops the round."""
    path = directory / PROFILE
    data = yaml.safe_load(path.read_text())
    data["verdict"]["infra_retries"] = 0
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def a_round(directory: Path, testbed: Failing) -> RoundReport:
    """A budget-2 round (or its resume) on the CLI's ledger and the test's MLflow, walking
    ``CHANGES``."""
    ledger = Ledger(os.environ["ORCHESTRATE_LEDGER"])
    loop = RoundRunner(
        load_profile(str(directory / PROFILE)),
        ledger,
        MlflowSink(),
        testbed,
        SweepProposer(CHANGES),
        ApprovalGate(ledger, "auto"),
        RoundDisplay(Console(file=io.StringIO())),
    )
    try:
        return loop.run(RoundOptions(budget=2, proposer="sweep", approve="auto"))
    finally:
        ledger.close()


def veto(directory: Path, experiment: int, reason: str) -> Any:
    return orchestrate(
        directory, "experiments", "veto", str(experiment), "--reason", reason, "-p", PROFILE
    )


def test_a_change_that_only_the_infrastructure_fails_is_vetoed_and_the_round_goes_on(
    cli_workdir: Path, mlflow_db: MlflowStore
) -> None:
    write_scripted_profile(cli_workdir)
    no_retries(cli_workdir)
    # K=5's weights are on no node's disk and the hub is away: every boot of it is `network`
    testbed = Failing(lambda n, c: "network" if c["num_speculative_tokens"] == 5 else None)
    with pytest.raises(InfrastructureFault) as stopped:
        a_round(cli_workdir, testbed)
    ledger = Ledger(os.environ["ORCHESTRATE_LEDGER"])
    baseline, k5 = ledger.experiments(cluster="scripted")
    assert (k5.knob, k5.value, k5.state != State.DECIDED) == ("num_speculative_tokens", 5, True)
    # the stop's line says what a person can do besides waiting
    assert f"`orchestrate experiments veto {k5.id} --reason …`" in stopped.value.message
    # a resume, with nothing done, stops on it again
    with pytest.raises(InfrastructureFault):
        a_round(cli_workdir, testbed)
    assert [c["num_speculative_tokens"] for c in testbed.tried[-2:]] == [5, 5]

    # the morning's ``status`` names the change under way, its boots and how they failed
    shown = orchestrate(cli_workdir, "status", "--json", "-p", PROFILE)
    assert shown.returncode == 0, shown.stderr
    [under] = json.loads(shown.stdout)["running_round"]["undecided"]
    assert (under["experiment"], under["boots"], under["failed"]) == (k5.id, 2, {"network": 2})
    assert under["measurements"] == 0  # both failed: nothing measured
    said = " ".join(orchestrate(cli_workdir, "status", "-p", PROFILE).stdout.split())
    # with the proposal it came from (``proposals list`` names the experiment it became)
    assert (
        f"under way: experiment #{k5.id} (proposal {k5.proposal_id}: {k5.description}), "
        "2 boot(s) paid for 0 measurement(s), failed: network ×2"
    ) in said
    assert under["proposal"] == k5.proposal_id is not None
    why = "K=5's drafter is not on the nodes' disks and the hub is away this week"
    # not while a round holds the cluster: it may be booting this very change
    with ClusterLease(ledger, "scripted"):
        held = veto(cli_workdir, k5.id, why)
    assert held.returncode == 8, held.stderr
    assert "cluster scripted is leased to" in held.stderr
    assert ledger.experiment(k5.id).state != State.DECIDED
    # without words, the baseline, an experiment of no one: one line each, nothing changed
    assert veto(cli_workdir, k5.id, "  ").returncode == 2
    base = veto(cli_workdir, baseline.id, why)
    assert base.returncode == 3 and f"experiment #{baseline.id} is the baseline" in base.stderr
    assert len(base.stderr.strip().splitlines()) == 1
    assert veto(cli_workdir, 999, why).returncode == 3
    assert ledger.experiment(k5.id).state != State.DECIDED

    done = veto(cli_workdir, k5.id, why)
    assert done.returncode == 0, done.stderr
    actor = f"{getpass.getuser()}@{socket.gethostname()}"
    assert done.stdout.startswith(
        f"vetoed experiment #{k5.id} by {actor}: it bars num_speculative_tokens=5"
    )
    vetoed = ledger.experiment(k5.id)
    assert (vetoed.state, vetoed.status) == (State.DECIDED, Status.VETOED)
    assert vetoed.description.endswith(f"; vetoed by {actor} while undecided: {why}")
    verdict = ledger.verdict(k5.id)
    assert verdict is not None and (verdict.rule, verdict.reason) == ("veto", why)
    assert verdict.stats == {"by": actor, "undecided": True, "boots": 2, "failed": {"network": 2}}
    # its boots stay as they were: the record of what failed, and how
    boots = ledger.boots(k5.id)
    assert [(b.status, b.failure_class) for b in boots] == [(BootStatus.FAILED, "network")] * 2
    again = veto(cli_workdir, k5.id, why)
    assert again.returncode == 3 and "is decided already (vetoed)" in again.stderr
    # barred as a vetoed proposal is, with the person's words
    [row] = listed(cli_workdir)
    assert (row["id"], row["source"], row["region"], row["reason"]) == (
        k5.id,
        "veto",
        "num_speculative_tokens=5",
        why,
    )
    export = orchestrate(cli_workdir, "export", "-", "--profile", PROFILE).stdout
    shown = orchestrate(cli_workdir, "status", "--json", "-p", PROFILE)
    assert json.loads(shown.stdout)["running_round"]["undecided"] == []
    assert f"vetoed by {actor} while undecided: {why}" in export
    ledger.close()

    # the same command goes on with the next changes: K=5 is not booted again, and the budget
    # is spent on changes that were decided, the veto not among them
    tried = len(testbed.tried)
    resumed = a_round(cli_workdir, testbed)
    assert resumed.resumed and resumed.stopped_by == "budget"
    assert all(c["num_speculative_tokens"] != 5 for c in testbed.tried[tried:])
    candidates = [e for e in resumed.experiments if e.kind == Kind.CANDIDATE]
    assert [(e.knob, e.value, e.status == Status.VETOED) for e in candidates] == [
        ("num_speculative_tokens", 5, True),
        ("num_speculative_tokens", 6, False),
        ("max_num_batched_tokens", 4096, False),
    ]
    # MLflow, filled in from the ledger by the resume: the run is a veto with the words
    assert candidates[0].mlflow_run_id is not None
    run = MlflowClient(mlflow_db.tracking_uri).get_run(candidates[0].mlflow_run_id)
    # ended FINISHED: a person's decision, not a failure (MLflow's UI shows KILLED as one)
    assert (run.info.status, run.data.tags["status"]) == ("FINISHED", "vetoed")
    assert run.data.tags["veto_reason"] == why
