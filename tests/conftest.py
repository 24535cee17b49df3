"""Fixtures shared by every test.

Each test gets its own MLflow sqlite store (autouse, ``tests/fixtures/mlflow_store.py``) and
may ask for a real PostgreSQL database (``postgres``, ``pg_url``, ``ledger_url`` in
``tests/fixtures/postgres.py``), or for a server of its own across a link it can cut
(``far_postgres``, ``tests/fixtures/partition.py``).
"""

from __future__ import annotations

import os

# Before anything imports mlflow: a test run never phones home.
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

pytest_plugins = [
    "pytester",
    "tests.fixtures.cli",
    "tests.fixtures.mlflow_store",
    "tests.fixtures.messages_api",
    "tests.fixtures.postgres",
    "tests.fixtures.sshd",
    "tests.fixtures.partition",  # after the two it builds on (their asserts rewritten first)
]
