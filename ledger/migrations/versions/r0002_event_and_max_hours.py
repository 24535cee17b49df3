"""Schema 2: the ``event`` table and the round's ``max_hours`` (its wall-clock cap)."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    """Add the event table and ``round.max_hours`` (NULL, no cap, for the rounds before it)."""
    op.create_table(
        "event",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("cluster", sa.String(length=128), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("subject", sa.String(length=128), nullable=False),
        sa.Column("detail", sa.JSON(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("actor", sa.String(length=256), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_event_cluster", "event", ["cluster"])
    op.create_index("ix_event_kind", "event", ["kind"])
    # nullable, so SQLite adds it with a plain ALTER TABLE (no table copy)
    op.add_column("round", sa.Column("max_hours", sa.Float(), nullable=True))


def downgrade() -> None:
    """Not supported: a ledger is never downgraded (restore the copy taken before upgrading)."""
    raise NotImplementedError("a ledger is never downgraded")
