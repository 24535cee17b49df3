"""The ledger's errors."""

from __future__ import annotations

from ledger.records import LeaseRecord
from orchestrator.errors import OrchestrateError


class LedgerError(OrchestrateError):
    """The ledger cannot be opened, read or written; carries the URL (password hidden)."""

    exit_code = 4

    def __init__(self, message: str, *, url: str) -> None:
        super().__init__(message)
        self.url = url


class LeaseHeld(LedgerError):
    """Another orchestrator holds the cluster's lease; carries the holder. Exit 8, as a node
    claimed by another orchestrator (issue #17)."""

    exit_code = 8

    def __init__(self, message: str, *, url: str, lease: LeaseRecord) -> None:
        super().__init__(message, url=url)
        self.lease = lease
