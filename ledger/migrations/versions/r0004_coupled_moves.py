"""Schema 4: a coupled move's second knob (``proposal.coupled_*``, ``experiment.coupled_*``).

A coupled move (``agents.coupled``) changes the knob whose value failed and the one that
enables it. The first stays in ``knob``/``value`` as for any change, so a reader that knows
nothing of coupled moves still reads it as a change of that knob; the enabling knob and its
values go in new columns, NULL for every one-knob row (all the rows before this revision).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    """Add the nullable coupled-move columns (NULL: a one-knob change)."""
    # nullable, so SQLite adds each with a plain ALTER TABLE (no table copy)
    op.add_column("proposal", sa.Column("coupled_knob", sa.String(length=64), nullable=True))
    op.add_column("proposal", sa.Column("coupled_old", sa.Text(), nullable=True))
    op.add_column("proposal", sa.Column("coupled_new", sa.Text(), nullable=True))
    op.add_column("experiment", sa.Column("coupled_knob", sa.String(length=64), nullable=True))
    op.add_column("experiment", sa.Column("coupled_value", sa.Text(), nullable=True))


def downgrade() -> None:
    """Not supported: a ledger is never downgraded (restore the copy taken before upgrading)."""
    raise NotImplementedError("a ledger is never downgraded")
