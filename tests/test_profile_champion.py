"""The profile's ``champion:`` against the ledger: a baseline left undecided by the
infrastructure is not resumed with a ``champion:`` the user has edited since (closed, its boots
kept, the new one measured), and an edit of ``champion:`` once the ledger has a champion is
said, not ignored in silence. Real twin engines (two nodes, one short cell), the real command
line, SQLite ledger and MLflow store; a real listener on the cluster's port for the stop."""

from __future__ import annotations

import csv
import io
import json
import socket
from pathlib import Path
from typing import Any

import pytest
import yaml
from mlflow.tracking import MlflowClient

from knobs.vocabulary import Kind, State, Status
from ledger import Ledger
from orchestrator.known_bad import barred_regions
from orchestrator.profile import load_profile
from tests.fixtures.cli import orchestrate
from tests.fixtures.mlflow_store import MlflowStore
from tests.fixtures.profiles import small_fast_profile


def profile_data(workdir: Path) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((workdir / "profile.yaml").read_text())
    return data


def edit_champion(workdir: Path, **values: Any) -> None:
    data = profile_data(workdir)
    data["champion"].update(values)
    (workdir / "profile.yaml").write_text(yaml.safe_dump(data, sort_keys=False))


def round_cmd(workdir: Path) -> Any:
    return orchestrate(workdir, "round", "--budget", "1", "--profile", "profile.yaml", timeout=300)


@pytest.mark.timeout(600)
def test_an_undecided_baseline_is_closed_when_champion_changed_and_the_new_one_measured(
    cli_workdir: Path, mlflow_db: MlflowStore
) -> None:
    small_fast_profile(
        cli_workdir,
        verdict={"policy": "threshold", "threshold_pct": 2.0, "champion_boots": 1,
                 "infra_retries": 0},
    )  # fmt: skip
    port = profile_data(cli_workdir)["cluster"]["port"]
    with socket.socket() as squatter:  # another process holds the cluster's port: exit 5
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        stopped = round_cmd(cli_workdir)
    assert stopped.returncode == 5, stopped.stderr
    with Ledger(f"sqlite:///{cli_workdir}/orchestrate.db") as ledger:
        (old,) = ledger.experiments()
        assert old.kind == Kind.BASELINE and old.state != State.DECIDED, old
        booted = len(ledger.boots(old.id))
    assert old.config["gpu_memory_utilization"] == 0.85

    status = orchestrate(cli_workdir, "status", "--profile", "profile.yaml")
    assert "under way: experiment #1" in status.stdout and "closes" not in status.stdout

    # the user edits champion: before the same command resumes the round
    edit_champion(cli_workdir, gpu_memory_utilization=0.8)
    status = orchestrate(cli_workdir, "status", "--profile", "profile.yaml")
    assert (
        "the resume closes it: champion: changed since (gpu_memory_utilization 0.85 → 0.8), "
        "and the baseline of champion: as it is now is measured"
    ) in " ".join(status.stdout.split()), status.stdout
    resumed = round_cmd(cli_workdir)
    assert resumed.returncode == 0, resumed.stderr
    said = [" ".join(line.split()) for line in resumed.stdout.splitlines()]
    line = (
        "the baseline left undecided (experiment #1) is of champion: as it was "
        "(gpu_memory_utilization=0.85); champion: in profile twin-test says "
        "gpu_memory_utilization=0.8 now: #1 is closed, its boots kept, and the baseline of the "
        "new one is measured"
    )
    assert line in said, resumed.stdout
    # said as the round resumes, before it takes up any experiment
    assert said.index(line) < said.index("[baseline] baseline (champion as configured)"), said

    with Ledger(f"sqlite:///{cli_workdir}/orchestrate.db") as ledger:
        first, second, *_ = ledger.experiments()
        verdict = ledger.verdict(first.id)
        champion = ledger.champion("twin-local")
        assert len(ledger.boots(first.id)) == booted  # its boots kept, none more
        (rnd,) = ledger.rounds("twin-local")
    assert (first.id, first.kind, first.status) == (1, Kind.BASELINE, Status.VETOED)
    assert verdict is not None and verdict.rule == "champion-changed", verdict
    assert "gpu_memory_utilization 0.85 → 0.8" in verdict.reason
    assert "nothing is barred" in verdict.reason
    assert (second.kind, second.status) == (Kind.BASELINE, Status.KEEP)
    assert second.config["gpu_memory_utilization"] == 0.8
    assert champion is not None and champion.config["gpu_memory_utilization"] == 0.8
    assert rnd.status == "done"
    prof = load_profile(str(cli_workdir / "profile.yaml"), base_dir=cli_workdir)
    with Ledger(f"sqlite:///{cli_workdir}/orchestrate.db") as ledger:
        # the closed baseline bars nothing (the round's change may: its own verdict)
        assert [r for r in barred_regions(prof, ledger) if r.experiment.id == 1] == []

    # the closed baseline stays readable: results.tsv, experiments show, MLflow
    exported = orchestrate(cli_workdir, "export", "-", "--profile", "profile.yaml")
    rows = list(csv.DictReader(io.StringIO(exported.stdout), delimiter="\t"))
    assert rows[0]["status"] == "vetoed", rows[0]
    shown = orchestrate(
        cli_workdir, "experiments", "show", "1", "--profile", "profile.yaml", "--json"
    )
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["verdict"]["rule"] == "champion-changed"
    run = MlflowClient(mlflow_db.tracking_uri).get_run(first.mlflow_run_id or "")
    assert run.data.tags["status"] == "vetoed" and run.info.status == "FINISHED", run.data.tags


def ignored_line(cli_workdir: Path) -> str:
    """The line ``champion:`` at gpu_memory_utilization 0.8 and MNBT 4096 is answered with,
    given the ledger's champion as it is."""
    with Ledger(f"sqlite:///{cli_workdir}/orchestrate.db") as ledger:
        champion = ledger.champion("twin-local")
    assert champion is not None
    edited = {"gpu_memory_utilization": 0.8, "max_num_batched_tokens": 4096}
    moved = [k for k, v in edited.items() if champion.config[k] != v]
    used = ", ".join(f"{k}={champion.config[k]}" for k in moved)
    says = ", ".join(f"{k}={edited[k]}" for k in moved)
    return (
        f"champion: in profile twin-test is not the ledger's champion (experiment "
        f"#{champion.experiment_id}, measured), and the ledger's is used: it has {used} where "
        f"champion: says {says}; champion: starts only a "
        "cluster the ledger has no champion for: to start from it, run under a new ledger "
        "(ORCHESTRATE_LEDGER, ledger_url:) or another cluster.name"
    )


def said(ran: Any) -> str:
    return " ".join(ran.stdout.split())


@pytest.mark.timeout(600)
def test_champion_edited_once_the_ledger_has_one_is_said_once_by_a_round_and_by_status(
    cli_workdir: Path,
) -> None:
    small_fast_profile(cli_workdir)
    first = round_cmd(cli_workdir)
    assert first.returncode == 0, first.stderr
    assert "champion: in profile" not in said(first)  # its own baseline: nothing to say
    status = orchestrate(cli_workdir, "status", "--profile", "profile.yaml")
    assert status.returncode == 0 and "champion: in profile" not in said(status), status.stdout

    # two knobs moved: no one-knob change the round kept can be the same config
    edit_champion(cli_workdir, gpu_memory_utilization=0.8, max_num_batched_tokens=4096)
    line = ignored_line(cli_workdir)
    status = orchestrate(cli_workdir, "status", "--profile", "profile.yaml")
    assert status.returncode == 0, status.stderr
    assert line in said(status), status.stdout
    seen = orchestrate(cli_workdir, "status", "--profile", "profile.yaml", "--json")
    assert json.loads(seen.stdout)["profile_champion_not_used"] == line

    second = round_cmd(cli_workdir)
    assert second.returncode == 0, second.stderr
    assert line in said(second), second.stdout
    with Ledger(f"sqlite:///{cli_workdir}/orchestrate.db") as ledger:
        rounds = ledger.rounds("twin-local")
        # the ledger's champion was used: no baseline of champion: in round 2
        assert [e.kind for e in ledger.experiments(round_id=rounds[1].id)] == [Kind.CANDIDATE]

    # the same champion: again: said by status while it holds, not by every round
    line = ignored_line(cli_workdir)
    third = round_cmd(cli_workdir)
    assert third.returncode == 0, third.stderr
    assert "champion: in profile" not in said(third), third.stdout
    status = orchestrate(cli_workdir, "status", "--profile", "profile.yaml")
    assert line in said(status), status.stdout

    # edited again and deployed by `cluster up`, which records the profile: it says it then
    edit_champion(cli_workdir, gpu_memory_utilization=0.75)
    up = orchestrate(cli_workdir, "cluster", "up", "--profile", "profile.yaml")
    assert up.returncode == 0, up.stderr
    assert "gpu_memory_utilization=0.75" in said(up) and "champion: in profile" in said(up), said(
        up
    )
