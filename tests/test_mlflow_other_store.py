"""An MLflow store that is not the one this ledger's rounds logged to (moved, cleaned, or a
relative ``sqlite:///mlflow.db`` taken from another folder, a cron job's): MLflow would make a
new empty store and the history would split across two files, the round saying nothing. The
ledger names the runs it logged; a store without the last of them is refused at the round's
start in one line, nothing written to it or to the ledger, unless ``--new-mlflow-store`` says a
new store is meant. The ledger is a real one (the schema-4 fixture: two rounds of twin-2node
logged to MLflow), the stores real sqlite ones, the command the real CLI; nothing boots."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from mlflow.tracking import MlflowClient

from ledger import Ledger
from tests.fixtures.cli import orchestrate
from tests.fixtures.mlflow_store import MlflowStore

LEDGERS = Path(__file__).parent / "fixtures" / "ledgers"
PROFILE = str(LEDGERS / "schema4.profile.yaml")
#: the run of round 2, the last of the two rounds the schema-4 ledger logged to MLflow
LAST_RUN = "9ab90a3cd19940e7aa1b732f19f57eef"
ROUND = ("round", "--budget", "1", "--profile", PROFILE)


def _ledger(tmp_path: Path) -> dict[str, str]:
    shutil.copyfile(LEDGERS / "schema4.sqlite", tmp_path / "orchestrate.db")
    return {**os.environ, "ORCHESTRATE_LEDGER": f"sqlite:///{tmp_path}/orchestrate.db"}


def _refused_once(stderr: str) -> str:
    errors = [line for line in stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, stderr
    return errors[0]


def _rounds(env: dict[str, str]) -> list[int]:
    with Ledger(env["ORCHESTRATE_LEDGER"]) as ledger:
        return [r.id for r in ledger.rounds("twin-2node")]


def test_a_store_that_is_not_there_while_the_ledger_logged_rounds_is_refused_not_made(
    tmp_path: Path, mlflow_store: MlflowStore
) -> None:
    """The store's file gone (moved, cleaned): one line naming the store, the ledger's rounds
    and its last run, and what to do; exit 4; no store made, no round started."""
    env = _ledger(tmp_path)
    refused = orchestrate(tmp_path, *ROUND, env=env)
    assert refused.returncode == 4, refused.stdout + refused.stderr
    line = _refused_once(refused.stderr)
    assert mlflow_store.tracking_uri in line, line
    assert LAST_RUN in line and "2 rounds" in line and "orchestrate/twin-2node" in line, line
    assert "MLFLOW_TRACKING_URI" in line and "--new-mlflow-store" in line, line
    assert not mlflow_store.db_path.exists(), "no new store is made"
    assert _rounds(env) == [1, 2], "no round is started"


def test_another_store_without_the_ledgers_runs_is_refused_and_gets_nothing(
    tmp_path: Path, mlflow_db: MlflowStore
) -> None:
    """A store that exists but never saw this ledger's runs (another project's, or one a
    night from another folder made): refused in one line; it gets no experiment, no run;
    ``status`` names it."""
    env = _ledger(tmp_path)
    refused = orchestrate(tmp_path, *ROUND, env=env)
    assert refused.returncode == 4, refused.stdout + refused.stderr
    line = _refused_once(refused.stderr)
    assert mlflow_db.tracking_uri in line and LAST_RUN in line, line
    client = MlflowClient(tracking_uri=mlflow_db.tracking_uri)
    assert client.get_experiment_by_name("orchestrate/twin-2node") is None
    assert client.search_runs([e.experiment_id for e in client.search_experiments()]) == []
    assert _rounds(env) == [1, 2]
    status = orchestrate(tmp_path, "status", "--profile", PROFILE, "--json", env=env)
    assert status.returncode == 0, status.stderr
    said = json.loads(status.stdout)["other_mlflow_store"]
    assert mlflow_db.tracking_uri in said and LAST_RUN in said, said


def test_a_relative_sqlite_uri_from_another_folder_names_the_file_it_was_taken_for(
    tmp_path: Path,
) -> None:
    """``sqlite:///mlflow.db`` run from another folder (a cron job's cwd is $HOME): the line
    says which absolute file the relative URI was taken for, and makes none there; ``status``
    run from there says so too."""
    env = {**_ledger(tmp_path), "MLFLOW_TRACKING_URI": "sqlite:///mlflow.db"}
    home = tmp_path / "home"
    home.mkdir()
    refused = orchestrate(home, *ROUND, env=env)
    assert refused.returncode == 4, refused.stdout + refused.stderr
    line = _refused_once(refused.stderr)
    assert f"sqlite:///{home}/mlflow.db" in line, line
    assert "relative" in line and f"taken from {home}" in line, line
    assert not (home / "mlflow.db").exists()
    assert _rounds(env) == [1, 2]
    status = orchestrate(home, "status", "--profile", PROFILE, env=env)
    assert status.returncode == 0, status.stderr
    said = " ".join(status.stdout.split())
    assert f"MLflow at sqlite:///{home}/mlflow.db (the relative sqlite:///mlflow.db" in said, said
    assert LAST_RUN in said and "--new-mlflow-store" in said, said
    assert not (home / "mlflow.db").exists()


def test_new_mlflow_store_logs_to_a_new_store_from_then_on(
    tmp_path: Path, mlflow_store: MlflowStore
) -> None:
    """``--new-mlflow-store``: the round logs to the store named (the fixture's sweep has
    nothing left to try: the round opens and closes, nothing boots), its run the ledger's last
    from then on: the next command takes that store (``status`` no longer names it)."""
    env = _ledger(tmp_path)
    new = orchestrate(tmp_path, *ROUND, "--new-mlflow-store", env=env)
    assert new.returncode == 0, new.stdout + new.stderr
    with Ledger(env["ORCHESTRATE_LEDGER"]) as ledger:
        third = ledger.round(3)
    assert third.mlflow_run_id is not None
    client = MlflowClient(tracking_uri=mlflow_store.tracking_uri)
    assert client.get_run(third.mlflow_run_id).info.run_name == "round-3"
    status = orchestrate(tmp_path, "status", "--profile", PROFILE, "--json", env=env)
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["other_mlflow_store"] is None, "the store is the one now"


def test_a_champion_run_the_new_store_lacks_holds_nothing_open(
    tmp_path: Path, mlflow_store: MlflowStore
) -> None:
    """With ``--new-mlflow-store``, the champion's run is in the store its round logged to,
    not in this one: a re-measure's metric, a tag or a boot's logs for it failed as "Run …
    not found", the mirror fell behind, and each close tried it again: the round stayed open
    (exit 4) night after night. Writes for a run this store lacks are now left to the ledger
    (its texts held there); the mirror keeps up."""
    from ledger.mlflow_sink import MlflowSink
    from orchestrator.runlog import RunLog

    env = _ledger(tmp_path)
    with Ledger(env["ORCHESTRATE_LEDGER"]) as ledger:
        champion = ledger.experiments()[0]
        assert champion.mlflow_run_id is not None
        runlog = RunLog(ledger, MlflowSink(mlflow_store.tracking_uri, "orchestrate/new"))
        runlog.remeasured(champion.mlflow_run_id, 1000.0, 7)
        runlog.keep_boots_set_aside(champion.mlflow_run_id, 7)
        runlog.boot_logs(champion, champion.mlflow_run_id, 99, {0: "an engine's log"})
        assert runlog.mirror.behind is None, runlog.mirror.behind
        held = ledger.held_texts(champion.id)
        assert [(h.path, h.text) for h in held] == [("logs/boot-99/node-0.log", "an engine's log")]
