"""Schema 6: the node a failed boot failed on (``boot.failed_rank``, ``boot.failed_host``), so
that ``orchestrate status`` counts each node's failures as it counts its clocks.

The boots recorded before keep NULL: their node is named only in their message, and a message
is not parsed into a column after the fact.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    """Add ``boot.failed_rank`` and ``boot.failed_host`` (NULL for the boots before them)."""
    # nullable, so SQLite adds them with a plain ALTER TABLE (no table copy)
    op.add_column("boot", sa.Column("failed_rank", sa.Integer(), nullable=True))
    op.add_column("boot", sa.Column("failed_host", sa.String(length=255), nullable=True))


def downgrade() -> None:
    """Not supported: a ledger is never downgraded (restore the copy taken before upgrading)."""
    raise NotImplementedError("a ledger is never downgraded")
