"""Schema 5: the ``held_text`` table, texts for MLflow that it did not take when written.

A boot's launchers and engine logs go to MLflow only; while MLflow is away (``Mirror``) they
are held in the ledger, redacted and compressed, until it takes them, then deleted.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    """Add the held_text table (empty: nothing was held before it)."""
    op.create_table(
        "held_text",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("experiment_id", sa.Integer(), nullable=False),
        sa.Column("path", sa.String(length=512), nullable=False),
        sa.Column("body", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["experiment_id"], ["experiment.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_held_text_experiment_id", "held_text", ["experiment_id"])


def downgrade() -> None:
    """Not supported: a ledger is never downgraded (restore the copy taken before upgrading)."""
    raise NotImplementedError("a ledger is never downgraded")
