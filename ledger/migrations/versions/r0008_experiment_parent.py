"""Schema 8: each change's parent, stored (``experiment.parent_experiment_id``): the champion
(its experiment) the change was proposed against, the config it changed one knob of.

Before, the parent was worked out on read (``evolution.Lineage.parent``: the champion row of
the largest experiment id below the change's own). The rows written before this revision keep
NULL, and are read that way still; a baseline's is NULL (it has no parent).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    """Add ``experiment.parent_experiment_id`` (NULL for the rows before it)."""
    # nullable, so SQLite adds it with a plain ALTER TABLE (no table copy)
    op.add_column("experiment", sa.Column("parent_experiment_id", sa.Integer(), nullable=True))


def downgrade() -> None:
    """Not supported: a ledger is never downgraded (restore the copy taken before upgrading)."""
    raise NotImplementedError("a ledger is never downgraded")
