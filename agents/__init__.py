"""Proposers: who suggests the next one-knob change, and the context they see.

A proposer is anything with a ``name`` and ``propose(context) -> Proposal`` (the ``Proposer``
protocol). It sees only a ``ProposalContext`` (knob space, champion, decided history, known-bad
regions, the keys decided under this champion, budget, seed, brief), must be deterministic
given it, and keeps no state between calls, so a killed round resumes with nothing to restore.
Every proposal is one knob away from the champion and ``context.allowed``; a proposer with
nothing allowed left raises ``ProposalExhausted``.

Built: ``optuna`` (TPE ask/tell, rebuilt from the history on every call) and ``sweep`` (a fixed
list, or every neighbour). ``make_proposer`` builds one by kind; ``claude`` and ``hybrid``
arrive with issue #6.
"""

from __future__ import annotations

from agents.context import (
    MEASURED,
    HistoryEntry,
    KnownBad,
    KnownBadSource,
    ProposalContext,
    Refusal,
    Status,
)
from agents.factory import KINDS, make_proposer
from agents.optuna_proposer import OptunaProposer
from agents.proposal import Proposal, ProposalExhausted, Proposer
from agents.sweep import SweepProposer

__all__ = [
    "KINDS",
    "MEASURED",
    "HistoryEntry",
    "KnownBad",
    "KnownBadSource",
    "OptunaProposer",
    "Proposal",
    "ProposalContext",
    "ProposalExhausted",
    "Proposer",
    "Refusal",
    "Status",
    "SweepProposer",
    "make_proposer",
]
