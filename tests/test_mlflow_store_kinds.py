"""``status`` checks that the MLflow store a round from here opens is the one the ledger's
rounds logged to, for every kind of store, not for SQLite files alone: a tracking server is
asked for the ledger's last run once, bounded (one request, no retries, its own timeout: a
server stopped or a port nobody answers is said as away, not as another store, and status does
not wait on it); a PostgreSQL database is read for it. The round's start says the same of the
same store, and refuses a database without MLflow's tables without making them (nothing is
written to a store that is not the ledger's). The ledger is the schema-4 fixture (two rounds of
twin-2node logged to MLflow); the servers are a real ``mlflow server`` and a real PostgreSQL;
nothing boots."""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path

import sqlalchemy
from mlflow.tracking import MlflowClient

from tests.fixtures.cli import orchestrate
from tests.fixtures.mlflow_store import MlflowServer
from tests.fixtures.ports import free_port

LEDGERS = Path(__file__).parent / "fixtures" / "ledgers"
PROFILE = str(LEDGERS / "schema4.profile.yaml")
#: the run of round 2, the last of the two rounds the schema-4 ledger logged to MLflow
LAST_RUN = "9ab90a3cd19940e7aa1b732f19f57eef"
ROUND = ("round", "--budget", "1", "--profile", PROFILE)
STATUS = ("status", "--json", "--profile", PROFILE)


def _env(tmp_path: Path, tracking_uri: str) -> dict[str, str]:
    shutil.copyfile(LEDGERS / "schema4.sqlite", tmp_path / "orchestrate.db")
    return {
        **os.environ,
        "ORCHESTRATE_LEDGER": f"sqlite:///{tmp_path}/orchestrate.db",
        "MLFLOW_TRACKING_URI": tracking_uri,
    }


def _status(tmp_path: Path, env: dict[str, str]) -> dict[str, str | None]:
    done = orchestrate(tmp_path, *STATUS, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    return {k: data.get(k) for k in ("other_mlflow_store", "mlflow_away")}


def _lacks(line: str) -> str:
    """What a line says the store lacks: the words the round's start and status share."""
    said = line.split(" is not the store this ledger's rounds logged to: ", 1)[1]
    return re.split(r"\. Nothing|; the next round", said)[0]


def test_a_tracking_server_without_the_ledgers_runs_is_named_by_status_and_one_away_as_away(
    tmp_path: Path, mlflow_server: MlflowServer
) -> None:
    env = _env(tmp_path, mlflow_server.url)
    MlflowClient(mlflow_server.url).search_experiments()  # its store opened: it answers now
    seen = _status(tmp_path, env)
    other = seen["other_mlflow_store"]
    assert other is not None and seen["mlflow_away"] is None, seen
    assert f"MLflow at {mlflow_server.url} is not the store" in other, other
    assert LAST_RUN in other and "--new-mlflow-store" in other, other
    text = orchestrate(tmp_path, "status", "--profile", PROFILE, env=env, timeout=120)
    assert text.returncode == 0 and other in text.stdout.replace("\n", " "), text.stdout
    # the round's start says the same of the same store, and refuses it
    refused = orchestrate(tmp_path, *ROUND, env=env)
    assert refused.returncode == 4, refused.stdout + refused.stderr
    line = refused.stderr.strip().splitlines()[-1]
    assert _lacks(line) == _lacks(other), (line, other)

    # a new store from then on: the server holds the ledger's last run, status says nothing
    new = orchestrate(tmp_path, *ROUND, "--new-mlflow-store", env=env)
    assert new.returncode == 0, new.stdout + new.stderr
    assert _status(tmp_path, env) == {"other_mlflow_store": None, "mlflow_away": None}

    # the server stopped (SIGSTOP: requests wait for ever), with the user's own long HTTP
    # timeout: away, said within the glance's bound, not another store
    mlflow_server.pause()
    try:
        start = time.monotonic()
        seen = _status(tmp_path, {**env, "MLFLOW_HTTP_REQUEST_TIMEOUT": "600"})
        took = time.monotonic() - start
    finally:
        mlflow_server.resume_answered()  # what it held answered: it stops as it should
    away = seen["mlflow_away"]
    assert seen["other_mlflow_store"] is None and away is not None, seen
    assert away.startswith(f"MLflow at {mlflow_server.url} is away (no answer within 10s)"), away
    assert "is not known" in away and "a round waits for it" in away, away
    assert took < 90, took  # the glance's 10 s and a loaded machine's start, not 600 s

    # a port nobody listens on: away, refused
    nobody = f"http://127.0.0.1:{free_port()}"
    seen = _status(tmp_path, {**env, "MLFLOW_TRACKING_URI": nobody})
    assert seen["other_mlflow_store"] is None, seen
    assert (seen["mlflow_away"] or "").startswith(
        f"MLflow at {nobody} is away (connection refused)"
    ), seen


def test_a_postgresql_store_without_mlflows_tables_is_named_by_status_and_left_unmade(
    tmp_path: Path, pg_url: str
) -> None:
    env = _env(tmp_path, pg_url)
    seen = _status(tmp_path, env)
    other = seen["other_mlflow_store"]
    assert other is not None and seen["mlflow_away"] is None, seen
    assert "there is no store there yet (a database without MLflow's tables)" in other, other
    assert LAST_RUN in other, other
    refused = orchestrate(tmp_path, *ROUND, env=env)
    assert refused.returncode == 4, refused.stdout + refused.stderr
    line = refused.stderr.strip().splitlines()[-1]
    assert _lacks(line) == _lacks(other), (line, other)
    engine = sqlalchemy.create_engine(pg_url)
    try:
        with engine.connect() as conn:
            assert sqlalchemy.inspect(conn).get_table_names() == [], "nothing made in it"
    finally:
        engine.dispose()
    # a new store from then on: the database holds the ledger's last run, status says nothing
    new = orchestrate(tmp_path, *ROUND, "--new-mlflow-store", env=env)
    assert new.returncode == 0, new.stdout + new.stderr
    assert _status(tmp_path, env) == {"other_mlflow_store": None, "mlflow_away": None}
