"""The fixtures for real services work: each ledger URL is a real, empty, writable database,
and the MLflow store guard fails a test that leaks a fluent run."""

from __future__ import annotations

import os
import socket
import sys

import pytest
import sqlalchemy as sa

from tests.fixtures import ports
from tests.fixtures.mlflow_store import MlflowStore


def test_ledger_url_is_a_fresh_writable_database(ledger_url: str) -> None:
    engine = sa.create_engine(ledger_url)
    try:
        assert sa.inspect(engine).get_table_names() == []  # fresh, empty
        metadata = sa.MetaData()
        table = sa.Table(
            "probe",
            metadata,
            sa.Column("id", sa.Integer, primary_key=True),
            sa.Column("name", sa.String(40), nullable=False),
        )
        metadata.create_all(engine)
        with engine.begin() as conn:
            conn.execute(sa.insert(table), [{"name": "alpha"}, {"name": "beta"}])
        with engine.connect() as conn:
            rows = conn.execute(sa.select(table.c.name).order_by(table.c.id)).scalars().all()
        assert rows == ["alpha", "beta"]
        assert engine.dialect.name == (
            "sqlite" if ledger_url.startswith("sqlite") else "postgresql"
        )
    finally:
        engine.dispose()


def test_pg_url_databases_are_distinct(pg_url: str, postgres: str) -> None:
    assert pg_url.startswith("postgresql+psycopg://")
    assert sa.make_url(pg_url).database != sa.make_url(postgres).database
    engine = sa.create_engine(pg_url)
    try:
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT current_database()")).scalar_one() == (
                sa.make_url(pg_url).database
            )
    finally:
        engine.dispose()


def test_mlflow_store_is_per_test_and_lazy(mlflow_store: MlflowStore) -> None:
    assert os.environ["MLFLOW_TRACKING_URI"] == mlflow_store.tracking_uri
    assert mlflow_store.tracking_uri == f"sqlite:///{mlflow_store.db_path}"
    assert os.environ["ORCHESTRATE_ARTIFACTS"] == str(mlflow_store.artifact_root)
    assert not mlflow_store.db_path.exists()  # nothing made until a test uses MLflow
    assert "ORCHESTRATE_LEDGER" not in os.environ


def test_mlflow_db_is_migrated(mlflow_db: MlflowStore) -> None:
    from mlflow.tracking import MlflowClient

    assert mlflow_db.db_path.is_file()
    names = [e.name for e in MlflowClient(mlflow_db.tracking_uri).search_experiments()]
    assert names == ["Default"]


def test_a_leaked_fluent_run_fails_the_test(pytester: pytest.Pytester) -> None:
    pytester.makeconftest('pytest_plugins = ["tests.fixtures.mlflow_store"]')
    pytester.makepyfile(
        test_leak="""
        import mlflow

        def test_leaks(mlflow_db):
            mlflow.start_run()

        def test_clean(mlflow_db):
            with mlflow.start_run():
                pass
        """
    )
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(["*ERROR at teardown of test_leaks*", "*left the MLflow run*"])
    assert "mlflow" in sys.modules
    import mlflow

    assert mlflow.active_run() is None  # the guard ended the leaked run


def test_a_free_port_is_never_one_an_outgoing_connection_may_be_given() -> None:
    """Servers' ports are drawn below the kernel's ephemeral range (a port from ``bind(0)``
    was later held by some connection for two minutes of a CI run), and are free: a server
    can listen on each; a port something listens on is never drawn."""
    low = ports.ephemeral_low()
    with socket.socket() as held:
        held.bind(("127.0.0.1", ports.free_port()))
        held.listen()
        taken = held.getsockname()[1]
        drawn = {ports.free_port() for _ in range(200)}
    assert taken not in drawn
    assert all(ports.LOW <= p < low for p in drawn), sorted(drawn)[-3:]
    for port in list(drawn)[:5]:
        with socket.socket() as server:
            server.bind(("127.0.0.1", port))
            server.listen()
