"""``Ledger``: the one place that opens sessions on the SQL ledger.

Every method is one transaction: it commits before it returns, so a process killed at any
point leaves the ledger at the last completed state change. The connection is ``ledger.base``'s;
each group of tables has its own module (leases, rounds and proposals, experiments and the
champion, boots, cells, drift and events), joined here.
"""

from __future__ import annotations

from ledger.errors import LeaseHeld, LedgerError, LedgerNotReady
from ledger.experiments import Experiments
from ledger.leases import Leases
from ledger.measures import Measures
from ledger.rounds import Rounds

__all__ = ["LeaseHeld", "Ledger", "LedgerError", "LedgerNotReady"]


class Ledger(Leases, Rounds, Experiments, Measures):
    """The SQL ledger at ``url`` (SQLite or PostgreSQL), created on first use."""
