"""Proposers: who suggests the next one-knob change, and the context they see.

A proposer is anything with a ``name`` and ``propose(context) -> Proposal`` (the ``Proposer``
protocol). It sees only a ``ProposalContext`` (knob space, champion, decided history, known-bad
regions, the keys decided under this champion, budget, seed, brief, LLM spend of the round)
and keeps no state between calls that a resumed round would need. Every proposal is one knob
away from the champion and ``context.allowed``, but for a coupled move (``coupled``: a value
that failed for a reason another knob explains, with that knob's next value; the Optuna,
Claude and hybrid proposers take one first: ``open_coupled``); a proposer with nothing
allowed left raises ``ProposalExhausted``.

Built: ``optuna`` (TPE ask/tell, rebuilt from the history on every call), ``sweep`` (a fixed
list, or every neighbour), ``claude`` (Claude through the Messages API's forced tool use, with
Optuna as its fallback) and ``hybrid`` (Claude picks the knob and direction, TPE the value).
``make_proposer`` builds one by kind. Only this package imports ``anthropic``.
"""

from __future__ import annotations

from agents.claude import ClaudeProposer
from agents.context import (
    ChampionCell,
    HistoryEntry,
    KnownBad,
    KnownBadSource,
    ProposalContext,
    Refusal,
    StepCostBelief,
)
from agents.coupled import COUPLED_NOTE, CoupledMove
from agents.digest import digest
from agents.factory import KINDS, make_proposer
from agents.hybrid import HybridProposer
from agents.llm import (
    METRIC_NOTES,
    TAG_NOTES,
    ClaudeOptions,
    LLMError,
    MissingApiKey,
    llm_notes,
    round_spend,
)
from agents.llm_cooloff import api_failures
from agents.llm_tool import change_tool
from agents.optuna_proposer import OptunaProposer
from agents.proposal import Proposal, ProposalExhausted, Proposer, proposed_by
from agents.sweep import SweepProposer
from knobs.vocabulary import MEASURED, Status

__all__ = [
    "COUPLED_NOTE",
    "KINDS",
    "MEASURED",
    "METRIC_NOTES",
    "TAG_NOTES",
    "ChampionCell",
    "ClaudeOptions",
    "ClaudeProposer",
    "CoupledMove",
    "HistoryEntry",
    "HybridProposer",
    "KnownBad",
    "KnownBadSource",
    "LLMError",
    "MissingApiKey",
    "OptunaProposer",
    "Proposal",
    "ProposalContext",
    "ProposalExhausted",
    "Proposer",
    "Refusal",
    "Status",
    "StepCostBelief",
    "SweepProposer",
    "api_failures",
    "change_tool",
    "digest",
    "llm_notes",
    "make_proposer",
    "proposed_by",
    "round_spend",
]
