"""A moment the ledger recorded, as a person reads it: to the minute, in UTC, said so
(``2026-12-05 03:12 UTC``), in every line and page that shows one (``--json`` keeps ISO 8601)."""

from __future__ import annotations

from datetime import UTC, datetime


def utc_minute(at: datetime) -> str:
    """``at`` as ``2026-12-05 03:12 UTC``: an aware moment in UTC whatever zone the database
    handed it back in; a naive one was written as UTC (SQLite's)."""
    aware = at if at.tzinfo is not None else at.replace(tzinfo=UTC)
    return f"{aware.astimezone(UTC):%Y-%m-%d %H:%M} UTC"
