"""The SQL ledger, results.tsv export and the MLflow sink.

The only package that imports sqlalchemy and mlflow. Callers get frozen records, never rows.
"""

from __future__ import annotations

from ledger.base import ledger_identity, server_identity
from ledger.errors import (
    CellRecordedAlready,
    LeaseLost,
    MlflowSinkError,
    NotInLedger,
    OtherMlflowStore,
)
from ledger.export import HEADER, tsv_text
from ledger.records import (
    BootRecord,
    CellReading,
    ChampionRecord,
    DriftRecord,
    EventRecord,
    ExperimentRecord,
    LeaseRecord,
    ProposalRecord,
    RoundRecord,
    UnwrittenCell,
    VerdictRecord,
)
from ledger.store import LeaseHeld, Ledger, LedgerError, LedgerNotReady, reading

__all__ = [
    "HEADER",
    "BootRecord",
    "CellReading",
    "CellRecordedAlready",
    "ChampionRecord",
    "DriftRecord",
    "EventRecord",
    "ExperimentRecord",
    "LeaseHeld",
    "LeaseLost",
    "LeaseRecord",
    "Ledger",
    "LedgerError",
    "LedgerNotReady",
    "MlflowSinkError",
    "NotInLedger",
    "OtherMlflowStore",
    "ProposalRecord",
    "RoundRecord",
    "UnwrittenCell",
    "VerdictRecord",
    "ledger_identity",
    "reading",
    "server_identity",
    "tsv_text",
]
