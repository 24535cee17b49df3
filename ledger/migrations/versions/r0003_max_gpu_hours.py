"""Schema 3: the round's ``max_gpu_hours`` (its GPU-hours cap, boots included)."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    """Add ``round.max_gpu_hours`` (NULL, no cap, for the rounds before it)."""
    # nullable, so SQLite adds it with a plain ALTER TABLE (no table copy)
    op.add_column("round", sa.Column("max_gpu_hours", sa.Float(), nullable=True))


def downgrade() -> None:
    """Not supported: a ledger is never downgraded (restore the copy taken before upgrading)."""
    raise NotImplementedError("a ledger is never downgraded")
