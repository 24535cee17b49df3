"""Schema 1: the ledger as the first release created it (``create_all`` of its models).

Frozen: written out table by table, never from ``ledger.models``, so later model changes do
not change what this revision builds.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    """Create the tables of schema 1."""
    _schema_version_and_lease()
    _round_and_proposal()
    _experiment()
    _boot_and_cells()
    _verdict_drift_champion()


def downgrade() -> None:
    """Not supported: a ledger is never downgraded (restore the copy taken before upgrading)."""
    raise NotImplementedError("a ledger is never downgraded")


def _schema_version_and_lease() -> None:
    op.create_table(
        "schema_version",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_table(
        "lease",
        sa.Column("cluster", sa.String(length=128), nullable=False),
        sa.Column("holder", sa.String(length=256), nullable=False),
        sa.Column("hostname", sa.String(length=256), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("acquired_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("cluster"),
    )


def _round_and_proposal() -> None:
    op.create_table(
        "round",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("cluster", sa.String(length=128), nullable=False),
        sa.Column("profile_name", sa.String(length=128), nullable=False),
        sa.Column("profile_digest", sa.String(length=64), nullable=False),
        sa.Column("budget", sa.Integer(), nullable=False),
        sa.Column("proposer", sa.String(length=64), nullable=False),
        sa.Column("approve", sa.String(length=16), nullable=False),
        sa.Column("seed", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("mlflow_run_id", sa.String(length=64), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_round_cluster", "round", ["cluster"])
    op.create_table(
        "proposal",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("round_id", sa.Integer(), nullable=False),
        sa.Column("source", sa.String(length=64), nullable=False),
        sa.Column("knob", sa.String(length=64), nullable=False),
        sa.Column("old_value", sa.Text(), nullable=False),
        sa.Column("new_value", sa.Text(), nullable=False),
        sa.Column("champion_key", sa.String(length=32), nullable=False),
        sa.Column("hypothesis", sa.Text(), nullable=False),
        sa.Column("expected_effect", sa.Text(), nullable=False),
        sa.Column("risk", sa.Text(), nullable=False),
        sa.Column("estimated_cost", sa.Text(), nullable=False),
        sa.Column("notes", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("decided_by", sa.String(length=64), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("decided_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["round_id"], ["round.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_proposal_round_id", "proposal", ["round_id"])


def _experiment() -> None:
    op.create_table(
        "experiment",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("cluster", sa.String(length=128), nullable=False),
        sa.Column("round_id", sa.Integer(), nullable=False),
        sa.Column("proposal_id", sa.Integer(), nullable=True),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("config_json", sa.Text(), nullable=False),
        sa.Column("config_key", sa.String(length=32), nullable=False),
        sa.Column("champion_key", sa.String(length=32), nullable=True),
        sa.Column("champion_objective", sa.Float(), nullable=True),
        sa.Column("knob", sa.String(length=64), nullable=True),
        sa.Column("value", sa.Text(), nullable=True),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=True),
        sa.Column("objective", sa.Float(), nullable=True),
        sa.Column("delta_pct", sa.Float(), nullable=True),
        sa.Column("accept_len", sa.Float(), nullable=True),
        sa.Column("failure_class", sa.String(length=32), nullable=True),
        sa.Column("failure_detail", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("decided_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("mlflow_run_id", sa.String(length=64), nullable=True),
        sa.ForeignKeyConstraint(["proposal_id"], ["proposal.id"]),
        sa.ForeignKeyConstraint(["round_id"], ["round.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("proposal_id"),
    )
    op.create_index("ix_experiment_cluster", "experiment", ["cluster"])
    op.create_index("ix_experiment_config_key", "experiment", ["config_key"])
    op.create_index("ix_experiment_round_id", "experiment", ["round_id"])


def _boot_and_cells() -> None:
    op.create_table(
        "boot",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("experiment_id", sa.Integer(), nullable=False),
        sa.Column("config_key", sa.String(length=32), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("measurement", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("failure_class", sa.String(length=32), nullable=True),
        sa.Column("failure_detail", sa.Text(), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("healthy_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["experiment_id"], ["experiment.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_boot_experiment_id", "boot", ["experiment_id"])
    op.create_table(
        "cell_result",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("experiment_id", sa.Integer(), nullable=False),
        sa.Column("boot_id", sa.Integer(), nullable=False),
        sa.Column("cell", sa.String(length=64), nullable=False),
        sa.Column("repeat", sa.Integer(), nullable=False),
        sa.Column("output_throughput", sa.Float(), nullable=False),
        sa.Column("accepted_per_step", sa.Float(), nullable=True),
        sa.Column("p90_ttft_ms", sa.Float(), nullable=False),
        sa.Column("errors", sa.Integer(), nullable=False),
        sa.Column("record", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["boot_id"], ["boot.id"]),
        sa.ForeignKeyConstraint(["experiment_id"], ["experiment.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("experiment_id", "boot_id", "cell", "repeat"),
    )
    op.create_index("ix_cell_result_experiment_id", "cell_result", ["experiment_id"])


def _verdict_drift_champion() -> None:
    op.create_table(
        "verdict",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("experiment_id", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("rule", sa.String(length=64), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("stats", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["experiment_id"], ["experiment.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("experiment_id"),
    )
    op.create_table(
        "drift",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("cluster", sa.String(length=128), nullable=False),
        sa.Column("experiment_id", sa.Integer(), nullable=False),
        sa.Column("measurement", sa.Integer(), nullable=False),
        sa.Column("before", sa.Float(), nullable=False),
        sa.Column("after", sa.Float(), nullable=False),
        sa.Column("drift_pct", sa.Float(), nullable=False),
        sa.Column("significant", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["experiment_id"], ["experiment.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_drift_cluster", "drift", ["cluster"])
    op.create_table(
        "champion",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("cluster", sa.String(length=128), nullable=False),
        sa.Column("experiment_id", sa.Integer(), nullable=False),
        sa.Column("config_json", sa.Text(), nullable=False),
        sa.Column("config_key", sa.String(length=32), nullable=False),
        sa.Column("objective", sa.Float(), nullable=False),
        sa.Column("since", sa.DateTime(timezone=True), nullable=False),
        sa.Column("retired_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["experiment_id"], ["experiment.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_champion_cluster", "champion", ["cluster"])
