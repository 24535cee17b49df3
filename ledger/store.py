"""``Ledger``: the one place that opens sessions on the SQL ledger.

Every method is one transaction: it commits before it returns, so a process killed at any
point leaves the ledger at the last completed state change. The connection is ``ledger.base``'s;
each group of tables has its own module (leases, rounds and proposals, experiments and the
champion, boots, cells, drift and events, texts held for MLflow), joined here.
"""

from __future__ import annotations

import sqlite3
import tempfile
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path

from sqlalchemy.engine import make_url

from ledger.errors import LeaseHeld, LedgerError, LedgerNotReady
from ledger.experiments import Experiments
from ledger.held import HeldTexts
from ledger.leases import Leases
from ledger.measures import Measures
from ledger.rounds import Rounds

__all__ = ["LeaseHeld", "Ledger", "LedgerError", "LedgerNotReady", "reading"]


class Ledger(Leases, Rounds, Experiments, Measures, HeldTexts):
    """The SQL ledger at ``url`` (SQLite or PostgreSQL), created on first use."""


@contextmanager
def reading(url: str) -> Iterator[Ledger]:
    """The ledger at ``url``, to read, changing nothing: itself when it is at this
    orchestrate's schema; a SQLite ledger of an older release through an upgraded copy in a
    temporary directory (read from the file with SQLite's backup API, the file opened
    read-only), a PostgreSQL one upgraded inside a transaction that is rolled back when the
    reading ends (its schema lock and the locks of the tables the upgrade alters held until
    then: another connection to those tables waits, so the reading should be short);
    either way what it says is what the next command that writes would see.

    Raises:
        LedgerNotReady: no ledger there.
        LedgerError: as ``Ledger``: a malformed URL, an unreachable server, a newer schema.
    """
    try:
        ledger = Ledger(url, read_only=True)
    except LedgerNotReady as e:
        parsed = make_url(url)
        sqlite = parsed.get_backend_name() == "sqlite"
        if e.found is None or (sqlite and not parsed.database):
            raise
        older, database = e, parsed.database
    else:
        with ledger:
            yield ledger
        return
    # outside the handler, so that an error of the caller's is not reported as raised while
    # handling the refusal
    if not sqlite:  # PostgreSQL's DDL is transactional: upgraded, then rolled back
        with Ledger(url, rehearse=True) as rehearsed:
            yield rehearsed
        return
    assert database is not None
    # an older SQLite ledger: read through an upgraded copy
    with tempfile.TemporaryDirectory(prefix="orchestrate-ledger-") as tmp:
        copy = Path(tmp) / "ledger.db"
        source = Path(database).resolve().as_uri() + "?mode=ro"
        try:
            with (
                closing(sqlite3.connect(source, uri=True)) as old,
                closing(sqlite3.connect(copy)) as new,
            ):
                old.backup(new)
        except sqlite3.Error as err:
            raise LedgerError(f"cannot read ledger {older.url}: {err}", url=older.url) from err
        with Ledger(f"sqlite:///{copy}") as upgraded:
            yield upgraded
