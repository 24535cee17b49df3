"""The ledger's errors."""

from __future__ import annotations

from ledger.records import LeaseRecord, UnwrittenCell
from orchestrator.errors import OrchestrateError


class LedgerError(OrchestrateError):
    """The ledger cannot be opened, read or written; carries the URL (password hidden) and
    whether the database did not answer (``unreachable``: a connection refused or lost, a
    SQLite file locked or unreadable for a while), which waiting may cure, rather than refused
    what it was asked."""

    exit_code = 4

    def __init__(
        self, message: str, *, url: str, unreachable: bool = False, read_only: bool = False
    ) -> None:
        super().__init__(message)
        self.url = url
        self.unreachable = unreachable
        #: a SQLite ledger on a filesystem that takes no write (read-only: ``ledger.disk``)
        self.read_only = read_only
        #: the cells measured whose writes this ledger did not take (kept for when it does)
        self.unwritten: list[UnwrittenCell] = []


class NotInLedger(LedgerError):
    """What a command named by its ID (a proposal, a round) is not in the ledger, or not in the
    state the command needs (a proposal decided already): a bad value given, exit 3, as an
    experiment ID the cluster does not have is. The ledger answered; exit 4 is for a ledger
    that failed (did not answer, refused, is not there yet or is newer)."""

    exit_code = 3


class CellRecordedAlready(LedgerError):
    """A cell of a boot and repeat the ledger holds already (``add_cell_result``)."""


class LedgerNotReady(LedgerError):
    """A ledger opened only to read (``Ledger(url, read_only=True)``) is not there yet, or is at
    an older schema that only a command that writes may upgrade; nothing was created or
    changed. Carries the schema revision found (``None``: no ledger there)."""

    def __init__(self, message: str, *, url: str, found: str | None = None) -> None:
        super().__init__(message, url=url)
        self.found = found


class LeaseHeld(LedgerError):
    """Another orchestrator holds the cluster's lease; carries the holder. Exit 8, as a node
    claimed by another orchestrator (issue #17)."""

    exit_code = 8

    def __init__(self, message: str, *, url: str, lease: LeaseRecord) -> None:
        super().__init__(message, url=url)
        self.lease = lease


class LeaseLost(LedgerError):
    """The cluster's lease is no longer this holder's: another orchestrator took it after it
    expired, or it is gone; carries the lease as it is now (``None``: none). Raised by a renewal
    and by a fenced write (``ledger.fence``), which wrote nothing. Exit 8, as ``OwnershipLost``:
    the cluster is another's, the ledger is fine. (A ledger that does not answer is a plain
    ``LedgerError``: the lease is still the holder's until the ledger says otherwise.)"""

    exit_code = 8

    def __init__(self, message: str, *, url: str, lease: LeaseRecord | None = None) -> None:
        super().__init__(message, url=url)
        self.lease = lease


class MlflowSinkError(OrchestrateError):
    """MLflow (or its database, or its artifact store) failed, or was configured wrongly.

    Carries the tracking URI (with any password masked), the operation that failed, and
    whether MLflow did not answer (``unreachable``: a connection refused, reset or timed out, a
    gateway's 502–504; waiting may cure it) rather than refused or was configured wrongly.
    """

    exit_code = 4

    def __init__(
        self, message: str, *, tracking_uri: str, operation: str, unreachable: bool = False
    ) -> None:
        super().__init__(message)
        self.tracking_uri = tracking_uri
        self.operation = operation
        self.unreachable = unreachable


class OtherMlflowStore(MlflowSinkError):
    """The tracking store opened does not hold a run the ledger logged to MLflow (``run_id``):
    another store, or a new one (``missing``: no SQLite file there at all); it was left as it
    was, nothing created or written. Exit 4, as a tracking URI that names nothing."""

    def __init__(self, message: str, *, tracking_uri: str, run_id: str, missing: bool) -> None:
        super().__init__(message, tracking_uri=tracking_uri, operation="open the tracking store")
        self.run_id = run_id
        self.missing = missing
