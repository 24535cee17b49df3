"""Schema 7: the definition each cell was measured under (``cell_result.spec``, the profile's
``CellSpec`` of the time), so that a reading counts only for the cell as it was measured: a
profile whose cell changed between a killed round and its resume, or between two rounds,
measures it again rather than pool two definitions (``orchestrator.measurements``).

The readings recorded before keep NULL: their definition is known only as far as the reading
itself records it (category, concurrency, context), and is not guessed after the fact.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    """Add ``cell_result.spec`` (NULL for the readings before it)."""
    # nullable, so SQLite adds it with a plain ALTER TABLE (no table copy)
    op.add_column("cell_result", sa.Column("spec", sa.JSON(), nullable=True))


def downgrade() -> None:
    """Not supported: a ledger is never downgraded (restore the copy taken before upgrading)."""
    raise NotImplementedError("a ledger is never downgraded")
