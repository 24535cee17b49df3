"""Schema 9: what each boot rendered (``boot.rendering``): a digest of the launchers it ran.

A reading counts for a config only under the rendering the profile gives it now: a knob
dropped (its flag no longer passed), a knob gained whose value renders a flag, a launcher
edited, each makes the champion's earlier boots another engine's, measured again before a
change is judged against it. The rows written before this revision keep NULL, and are judged
by the knobs the ledger recorded as dropped from the champion (``orchestrator.rendering``).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    """Add ``boot.rendering`` (NULL for the rows before it)."""
    # nullable, so SQLite adds it with a plain ALTER TABLE (no table copy)
    op.add_column("boot", sa.Column("rendering", sa.String(64), nullable=True))


def downgrade() -> None:
    """Not supported: a ledger is never downgraded (restore the copy taken before upgrading)."""
    raise NotImplementedError("a ledger is never downgraded")
