"""The fence on a lease holder's writes: a process that lost its cluster writes nothing more.

An orchestrator suspended past its lease (Ctrl-Z, a laptop asleep, SIGSTOP) may find on waking
that another took the cluster over and goes on with the round. Whatever it was doing, nothing
it writes may land in the ledger after that: every write a fenced ``Ledger`` makes commits only
if, in the same transaction, the cluster's lease row still names this holder (the row locked,
on PostgreSQL, so a takeover waits for the write or the write sees the takeover; SQLite holds
its one writer's lock from the write's first statement to its commit). The holder is what is
checked, not the expiry: a process whose lease expired while nobody took it still owns the
cluster, and its renewal renews it as it wakes. A ledger that does not answer fails the check
as it fails the write (a ``LedgerError`` that did not answer, waited out): an outage never
reads as a lost lease.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from ledger.errors import LeaseLost
from ledger.models import LeaseRow
from ledger.records import LeaseRecord
from ledger.rows import lease_record

#: ``Session.info``'s key for "this transaction wrote something" (set by the session events
#: ``ledger.base`` listens to).
WROTE = "orchestrate.wrote"


@dataclass
class Fence:
    """The lease a ledger's writes are fenced with: ``cluster``'s, held by ``holder``; and
    the time of the last write this holder committed (what a lost process says it stopped at)."""

    cluster: str
    holder: str
    last_write: datetime | None = None

    def check(self, s: Session, url: str) -> None:
        """Inside ``s``'s transaction: the lease row still names this holder.

        Raises:
            LeaseLost: it names another, or there is none (another took it over and has
                given it back since).
        """
        query = (
            select(LeaseRow)
            .where(LeaseRow.cluster == self.cluster)
            .with_for_update()
            .execution_options(populate_existing=True)
        )
        row = s.scalars(query).first()
        if row is not None and row.holder == self.holder:
            return
        current = None if row is None else lease_record(row)
        raise LeaseLost(self.lost_line(current), url=url, lease=current)

    def lost_line(self, current: LeaseRecord | None) -> str:
        """What a process that lost the cluster says, in one line."""
        last = "" if self.last_write is None else f" after {self.last_write:%H:%M:%S} UTC"
        if current is None:
            whom = "another orchestrator, which has since given it back"
            then = "run the same command to go on with the round"
        else:
            whom = (
                f"{current.holder} (pid {current.pid} on {current.hostname}), which took it "
                f"over at {current.acquired_at:%H:%M:%S} UTC"
            )
            then = "the round goes on under that one"
        return (
            f"this orchestrator ({self.holder}) lost cluster {self.cluster} to {whom}, while "
            f"this one was suspended or away: it wrote nothing to the ledger{last} and tore "
            f"nothing down; {then}"
        )
