"""The kill -9 suite (issue #17): ``orchestrate round`` SIGKILLed at each state boundary it
persists (``orchestrator/crashpoints.py``), then the same command run again. Whatever the
instant, the resume leaves the ledger, MLflow and results.tsv agreeing.

Real processes throughout: a two-node twin cluster (engines as real processes, noise off so
that the candidate is a keep every time), a real SQLite ledger and a real MLflow sqlite store.
The kill is exact, not timed: the round kills itself at the named point.

To keep the suite quick, one round is run once (a baseline, then a candidate that is not a
keep) and its ledger and MLflow store are copied into every test. The round each test runs
has a budget of one: a proposal, its experiment, and a keep promoted (one boot). For the drift
points the test's profile wants two trusted boots of the champion, so the champion is
re-measured first (boot 1, the drift recorded), and the candidate is boot 2.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sqlite3
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from mlflow.tracking import MlflowClient
from typer.testing import CliRunner

from knobs.records import CellSpec
from knobs.vocabulary import RoundStatus, State, Status
from ledger import Ledger
from orchestrator.cli.root import app
from orchestrator.crashpoints import CRASHPOINTS, ENV, SIGNAL_ENV, crashpoint
from orchestrator.errors import UsageError
from orchestrator.host_stalls import disturbed
from orchestrator.measurements import read_measurements
from orchestrator.verdict import objective, objective_of
from tests.fixtures.cli import orchestrate
from tests.fixtures.profiles import twin_profile_data, write_profile
from tests.test_round_twin import engines_alive

CLUSTER = "twin-local"
CELLS = ("code-c1", "prose-c8")

#: Each crash point, the time it is reached that the test kills at, and whether the champion is
#: re-measured first (the drift points). Two nodes and two cells a boot: ``node.started@1`` is
#: the worker up and the head not started, ``cell.recorded@1`` the first cell of two.
KILLS: tuple[tuple[str, int, bool], ...] = (
    ("mlflow.round.created", 1, False),
    ("round.started", 1, False),
    ("drift.recorded", 1, True),
    ("champion.rebased", 1, True),
    ("proposal.recorded", 1, False),
    ("proposal.approved", 1, False),
    ("experiment.recorded", 1, False),
    ("mlflow.run.created", 1, False),
    ("boot.started", 1, False),
    ("node.started", 1, False),
    ("health.passed", 1, False),
    ("smoke.passed", 1, False),
    ("cell.recorded", 1, False),
    ("measured", 1, False),
    ("verdict.committed", 1, False),
    ("champion.promoted", 1, False),
    ("mlflow.verdict", 1, False),
    ("round.finished", 1, False),
)


#: Points past the round's close in the ledger: the next command is no resume of it
#: (``test_killed_as_the_round_closes_the_next_round_completes_its_mlflow_run``).
CLOSED_KILLS = ("report.written",)


def test_every_crash_point_is_killed_at() -> None:
    assert sorted([*(point for point, _, _ in KILLS), *CLOSED_KILLS]) == sorted(CRASHPOINTS)
    assert len(KILLS) >= 12


def _profile_data(champion_boots: int) -> dict[str, Any]:
    data = twin_profile_data(nodes=2)
    argv = data["launcher"]["argv"]
    argv[argv.index("--tensor-parallel-size") + 1] = "2"
    # no noise: no node's clocks ever stuck, the keep below a keep every time
    data["launcher"]["env"].update(TWIN_NOISE="0", TWIN_BOOT_SCALE="5000")
    data["gates"].update(clocks_command=None, recover_command=None)
    data["cells"] = [c for c in data["cells"] if c["name"] in CELLS]
    # windows of a second: CI read the +25 % candidate below the champion once on 0.3 s (a
    # host's stall at a window's edge; cells so disturbed are measured again now), and once more
    # on 0.5 s under load; a stall moves at most its own length of tokens across an edge
    for cell in data["cells"]:
        cell["warmup_s"] = 0.1
        cell["duration_s"] = 1.0
    # one boot a verdict; with two trusted boots wanted, the champion is re-measured before
    # the round's proposal (a candidate was decided since its one boot)
    data["verdict"] = {
        "policy": "threshold",
        "threshold_pct": 2.0,
        "champion_boots": champion_boots,
        "ttft_p90_regression_pct": None,  # a loaded CI box's TTFT is no verdict on a config
    }
    # the champion drafts one token: drafting seven is some 25 % faster on the twin (CUDA
    # graphs, the template's candidate, are not a keep)
    data["champion"]["num_speculative_tokens"] = 1
    data["proposer"] = {
        "kind": "sweep",
        "sweep": [{"cuda_graphs": True}, {"num_speculative_tokens": 7}],
    }
    return data


@dataclass(frozen=True)
class Site:
    """A folder with a profile, a ledger and an MLflow store, and the environment that points
    ``orchestrate`` at them."""

    root: Path

    @property
    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != ENV}
        env.update(
            ORCHESTRATE_LEDGER=self.ledger_url,
            MLFLOW_TRACKING_URI=f"sqlite:///{self.root / 'mlflow.db'}",
            ORCHESTRATE_ARTIFACTS=str(self.root / "mlartifacts"),
        )
        return env

    @property
    def ledger_url(self) -> str:
        return f"sqlite:///{self.root / 'orchestrate.db'}"

    def evidence(self) -> str:
        """Each experiment's verdict and its cells as measured: what a test that finds an
        unexpected verdict prints (a loaded host's reading, or the config's)."""
        lines = []
        with Ledger(self.ledger_url) as ledger:
            for e in ledger.experiments(cluster=CLUSTER):
                verdict = ledger.verdict(e.id)
                said = f"{verdict.rule}: {verdict.reason}" if verdict else "no verdict"
                lines.append(f"exp {e.id} {e.config.as_dict()} {e.status}: {said}")
                for boot, repeat, c, _ in ledger.cell_results(e.id):
                    lines.append(
                        f"  boot {boot} #{repeat} {c.cell}: {c.output_throughput:.1f} tok/s, "
                        f"{c.errors} errors {list(c.error_samples)}, stalled "
                        f"{c.client_stall_s:.2f}+{c.engine_stall_s:.2f}s, "
                        f"measured again {c.measured_again}"
                    )
        return "\n".join(lines)

    def round(self, env: Mapping[str, str] | None = None) -> Any:
        args = ("round", "--budget", "1", "--profile", "profile.yaml", "--json")
        return orchestrate(self.root, *args, env={**self.env, **(env or {})}, timeout=180)


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Site:
    """A site after one round: the baseline kept, ``cuda_graphs`` not (slower with one
    drafted token, or its greedy outputs differ)."""
    site = Site(tmp_path_factory.mktemp("kill-template"))
    write_profile(site.root, _profile_data(champion_boots=1))
    first = site.round()
    assert first.returncode == 0, first.stderr
    statuses = [e["status"] for e in json.loads(first.stdout)["experiments"]]
    assert statuses[0] == Status.KEEP and statuses[1] != Status.KEEP, site.evidence()
    return site


def _copy(template: Site, root: Path) -> Site:
    """The template's ledger and MLflow store (its artifact root moved along)."""
    for name in ("orchestrate.db", "mlflow.db"):
        shutil.copyfile(template.root / name, root / name)
    shutil.copytree(template.root / "mlartifacts", root / "mlartifacts")
    old, new = (template.root / "mlartifacts").as_uri(), (root / "mlartifacts").as_uri()
    with sqlite3.connect(root / "mlflow.db") as db:
        db.execute(
            "UPDATE experiments SET artifact_location = replace(artifact_location, ?, ?)",
            (old, new),
        )
        db.execute("UPDATE runs SET artifact_uri = replace(artifact_uri, ?, ?)", (old, new))
    return Site(root)


@pytest.fixture
def site(template: Site, tmp_path: Path) -> Iterator[Site]:
    site = _copy(template, tmp_path)
    yield site
    # whatever happened, no engine outlives the test
    if engines_alive(tmp_path):
        orchestrate(tmp_path, "cluster", "down", "--profile", "profile.yaml", env=site.env)
        pytest.fail("an engine outlived the test")


@pytest.mark.parametrize(("point", "nth", "drift"), KILLS, ids=[f"{p}@{n}" for p, n, _ in KILLS])
def test_killed_at_a_state_boundary_the_resume_agrees(
    site: Site, point: str, nth: int, drift: bool
) -> None:
    write_profile(site.root, _profile_data(champion_boots=2 if drift else 1))
    killed = site.round({ENV: f"{point}@{nth}"})
    assert killed.returncode == -9, killed.stderr
    assert f"crashpoint {point}@{nth}: SIGKILL" in killed.stderr
    with Ledger(site.ledger_url) as ledger:
        assert ledger.unfinished_round(CLUSTER) is not None

    resumed = site.round()
    assert resumed.returncode == 0, resumed.stderr
    report = json.loads(resumed.stdout)
    assert report["resumed"] is True
    assert [e["status"] for e in report["experiments"]] == [Status.KEEP], site.evidence()
    assert engines_alive(site.root) == []
    with Ledger(site.ledger_url) as ledger:
        assert bool(ledger.drifts(CLUSTER)) == drift
        _ledger_agrees(ledger)
        _mlflow_agrees(ledger, MlflowClient(site.env["MLFLOW_TRACKING_URI"]))
        _export_agrees(ledger, site)


def test_killed_as_the_round_closes_the_next_round_completes_its_mlflow_run(
    site: Site, tmp_path: Path
) -> None:
    """Killed as its report is written (review I): the ledger has the round done and its
    parent run ended, but not yet given the round's numbers, report and results.tsv. ``status``
    says so; ``report`` with MLflow away writes the page and says the close is still owed,
    nothing lost; and the next round writes them before it starts, in one line."""
    write_profile(site.root, _profile_data(champion_boots=1))
    killed = site.round({ENV: "report.written"})
    assert killed.returncode == -9, killed.stderr
    assert "crashpoint report.written@1: SIGKILL" in killed.stderr
    with Ledger(site.ledger_url) as ledger:
        closed = ledger.rounds(CLUSTER)[-1]
        [decided] = [e for e in ledger.experiments(round_id=closed.id) if e.kind == "candidate"]
    assert closed.status == RoundStatus.DONE and closed.mlflow_run_id is not None
    owed = f"MLflow's run of round {closed.id} lacks its close"
    status = orchestrate(site.root, "status", "--profile", "profile.yaml", env=site.env)
    assert status.returncode == 0, status.stderr
    assert owed in status.stdout, status.stdout
    args = ("report", "--round", str(closed.id), "--profile", "profile.yaml")
    with socket.socket() as refused:  # bound, never listening: a tracking server away
        refused.bind(("127.0.0.1", 0))
        uri = f"http://127.0.0.1:{refused.getsockname()[1]}"
        report = orchestrate(site.root, *args, env={**site.env, "MLFLOW_TRACKING_URI": uri})
    assert report.returncode == 0, report.stderr
    said = " ".join(report.stdout.split())
    assert f"wrote reports/round-{closed.id}/report.html" in said, said
    assert (
        f"round {closed.id}'s report, results.tsv and numbers are not on its MLflow run yet ("
    ) in said, said
    assert "still owed, nothing is lost" in said, said
    status = orchestrate(site.root, "status", "--profile", "profile.yaml", env=site.env)
    assert owed in status.stdout, status.stdout

    after = site.round()
    assert after.returncode == 0, after.stderr
    assert json.loads(after.stdout)["round"] == closed.id + 1
    [said] = [line for line in after.stderr.splitlines() if f"round {closed.id}'s" in line]
    assert "MLflow" in said, after.stderr
    client = MlflowClient(site.env["MLFLOW_TRACKING_URI"])
    run = client.get_run(closed.mlflow_run_id)
    assert run.info.status == "FINISHED"
    assert run.data.metrics["experiments"] == 1.0
    assert {"report", "results.tsv"} <= {a.path for a in client.list_artifacts(run.info.run_id)}
    (into := tmp_path / "downloaded").mkdir()
    tsv = Path(client.download_artifacts(run.info.run_id, "results.tsv", str(into)))
    assert str(decided.id) in [row.split("\t")[0] for row in tsv.read_text().splitlines()]
    status = orchestrate(site.root, "status", "--profile", "profile.yaml", env=site.env)
    assert owed not in status.stdout, status.stdout


def test_the_report_of_a_round_whose_mlflow_close_is_owed_writes_it(site: Site) -> None:
    """Killed as its report is written: ``orchestrate report --round N`` the morning after
    said the round's MLflow close was owed and left it for the next round. It writes it now
    (the page it wrote, results.tsv and the round's numbers), in one line, and nothing is
    owed after: ``status`` says nothing of it, and a second report writes nothing more."""
    write_profile(site.root, _profile_data(champion_boots=1))
    killed = site.round({ENV: "report.written"})
    assert killed.returncode == -9, killed.stderr
    with Ledger(site.ledger_url) as ledger:
        closed = ledger.rounds(CLUSTER)[-1]
    assert closed.status == RoundStatus.DONE and closed.mlflow_run_id is not None
    args = ("report", "--round", str(closed.id), "--profile", "profile.yaml")
    report = orchestrate(site.root, *args, env=site.env)
    assert report.returncode == 0, report.stderr
    lines = report.stdout.strip().splitlines()
    said = [line for line in lines if f"round {closed.id}'s" in line]
    assert len(said) == 1, lines
    assert "were not on its MLflow run" in said[0] and said[0].endswith("written now"), said
    client = MlflowClient(site.env["MLFLOW_TRACKING_URI"])
    run = client.get_run(closed.mlflow_run_id)
    assert run.info.status == "FINISHED"
    assert run.data.metrics["experiments"] == 1.0
    assert {"report", "results.tsv"} <= {a.path for a in client.list_artifacts(run.info.run_id)}
    status = orchestrate(site.root, "status", "--profile", "profile.yaml", env=site.env)
    assert status.returncode == 0, status.stderr
    assert f"MLflow's run of round {closed.id} lacks its close" not in status.stdout
    again = orchestrate(site.root, *args, env=site.env)
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip().splitlines() == [
        f"wrote reports/round-{closed.id}/report.html (round {closed.id})"
    ], again.stdout


def _ledger_agrees(ledger: Ledger) -> None:
    """Every round done with its budget, every experiment decided, no boot left open, the
    champion the last keep, and a re-measured champion's objective its level's."""
    rounds = ledger.rounds(CLUSTER)
    assert [r.status for r in rounds] == [RoundStatus.DONE, RoundStatus.DONE]
    experiments = ledger.experiments(cluster=CLUSTER)
    assert all(e.state == State.DECIDED for e in experiments)
    for r in rounds:
        candidates = [e for e in experiments if e.round_id == r.id and e.kind == "candidate"]
        assert len(candidates) == r.budget
    assert ledger.open_boots() == []
    for e in experiments:
        # a boot killed mid-cells is continued by the next boot of the same measurement: no
        # cell of a measurement is measured twice
        measurement = {b.id: b.measurement for b in ledger.boots(e.id)}
        cells = [
            (measurement[boot], repeat, c.cell) for boot, repeat, c, _ in ledger.cell_results(e.id)
        ]
        assert len(cells) == len(set(cells)), f"a cell of experiment {e.id} was measured twice"
    keeps = sorted((e for e in experiments if e.status == Status.KEEP), key=lambda e: e.id)
    champion = ledger.champion(CLUSTER)
    assert champion is not None
    assert champion.experiment_id == keeps[-1].id
    assert champion.config.key == keeps[-1].config.key
    for row in ledger.champion_history(CLUSTER):
        drifts = [d for d in ledger.drifts(CLUSTER) if d.experiment_id == row.experiment_id]
        if drifts:
            specs = [CellSpec.model_validate(c) for c in _profile_data(1)["cells"]]
            measured = read_measurements(ledger, row.experiment_id, specs)
            level = [m for m in measured if m.complete]
            if drifts[-1].significant:
                level = [m for m in level if m.index >= drifts[-1].measurement]
            # a boot a busy host disturbed is not the level while another is (a loaded CI
            # host disturbed one: the level was the others', this sum had it in)
            level = [m for m in level if not disturbed(m.cells)] or level
            assert row.objective == pytest.approx(objective_of([objective(m.cells) for m in level]))


def _mlflow_agrees(ledger: Ledger, client: MlflowClient) -> None:
    """One run per experiment and per round, ended, with the ledger's status and objective,
    each metric logged once; every re-measurement logged once on the champion's run."""
    experiment = client.get_experiment_by_name(f"orchestrate/{CLUSTER}")
    assert experiment is not None
    runs = client.search_runs([experiment.experiment_id], max_results=1000)
    by_name: dict[str, list[Any]] = {}
    for run in runs:
        # an experiment's run is named for its change and, once decided, its verdict
        by_name.setdefault(run.info.run_name.split(" · ")[0], []).append(run)
    for r in ledger.rounds(CLUSTER):
        [parent] = by_name[f"round-{r.id}"]
        assert parent.info.run_id == r.mlflow_run_id
        assert parent.info.status == "FINISHED"
    ended = {Status.CRASH: "FAILED", Status.VETOED: "KILLED"}
    for e in ledger.experiments(cluster=CLUSTER):
        [run] = by_name[f"exp-{e.id}"]
        assert run.info.run_id == e.mlflow_run_id
        assert e.status is not None
        assert run.info.status == ended.get(e.status, "FINISHED"), e
        assert run.data.tags["status"] == e.status
        assert run.info.run_name.endswith(f" · {e.status}"), run.info.run_name
        if e.objective is not None:
            assert run.data.metrics["objective"] == pytest.approx(e.objective)
        for key in run.data.metrics:
            history = client.get_metric_history(run.info.run_id, key)
            assert len({m.step for m in history}) == len(history), (e.id, key)
        artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
        assert {"cells.json", "verdict.json"} <= artifacts, (e.id, artifacts)
    for d in ledger.drifts(CLUSTER):
        run_id = ledger.experiment(d.experiment_id).mlflow_run_id
        assert run_id is not None
        history = client.get_metric_history(run_id, "remeasure.objective")
        [logged] = [m.value for m in history if m.step == d.measurement]
        assert logged == pytest.approx(d.after)


def _export_agrees(ledger: Ledger, site: Site) -> None:
    """``orchestrate export``'s rows are the ledger's experiments."""
    profile = str(site.root / "profile.yaml")
    exported = CliRunner().invoke(app, ["export", "-", "--profile", profile], env=site.env)
    assert exported.exit_code == 0, exported.output
    rows = [line.split("\t") for line in exported.stdout.splitlines()[1:]]
    experiments = ledger.experiments(cluster=CLUSTER)
    assert [(int(r[0]), r[4]) for r in rows] == [(e.id, str(e.status)) for e in experiments]
    for row, e in zip(rows, experiments, strict=True):
        assert float(row[1]) == pytest.approx(e.objective or 0.0, abs=0.01)


def test_a_crash_point_fires_only_when_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    crashpoint("measured")  # unset: nothing
    monkeypatch.setenv(ENV, "round.finished")
    crashpoint("measured")  # another point: nothing
    with pytest.raises(ValueError, match="not a crash point"):
        crashpoint("no.such.point")
    for wrong in ("round.finish", "measured@0", "measured@x"):
        monkeypatch.setenv(ENV, wrong)
        with pytest.raises(UsageError, match=ENV):
            crashpoint("measured")
    # a point suspends instead of killing with SIGSTOP, and no other signal is taken
    monkeypatch.setenv(ENV, "measured")
    monkeypatch.setenv(SIGNAL_ENV, "SIGTERM")
    with pytest.raises(UsageError, match=SIGNAL_ENV):
        crashpoint("measured")
