"""Records that cross package boundaries: bench cells and their measured results, and what a
proposal's LLM calls used.

They live here, in the bottom package, so that ``cluster`` (which measures), ``ledger``
(which stores) and ``orchestrator`` (which judges) share one typed vocabulary.
Field names follow vLLM's ``bench serve`` result JSON where one exists.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

Category = Literal["prose", "code", "structured", "agentic"]

#: The suffix of a fingerprint key that records a repeat of a greedy prompt whose text differed
#: from the first (greedy decoding must repeat itself).
NONDETERMINISTIC = "!nondeterministic"


class CellSpec(BaseModel):
    """One bench cell: a prompt category × concurrency × context length, for a fixed time."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    category: Category
    concurrency: int = Field(ge=1, le=256)
    context_tokens: int = Field(default=0, ge=0, le=1_048_576)
    max_tokens: int = Field(default=128, ge=1, le=65_536)
    warmup_s: float = Field(default=1.0, ge=0, le=3600)
    duration_s: float = Field(default=5.0, gt=0, le=3600)
    #: the name it was measured under before (``renamed_from:``): its readings under that name
    #: count as its own where the definitions match (``orchestrator.cell_renames``). Not part
    #: of what it measures, so never dumped: not in a reading's recorded definition, nor in a
    #: profile's digest or revision
    renamed_from: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.-]{1,64}$", exclude=True)

    def same_definition(self, other: CellSpec) -> bool:
        """Whether ``other`` measures what this measures: every field but the names."""
        return self.model_dump(exclude={"name"}) == other.model_dump(exclude={"name"})


class NodeClockRecord(BaseModel):
    """One node's clocks as read around a measurement."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rank: int
    sm_clock_mhz: float
    matmul_rate: float = Field(description="relative to the node's nominal rate; 1.0 is healthy")


class CellResultRecord(BaseModel):
    """What one cell measured on one boot."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    cell: str
    category: Category
    concurrency: int
    context_tokens: int
    duration: float = Field(description="measurement seconds (after warm-up)")
    completed: int = Field(description="requests finished inside the window")
    errors: int = 0
    error_samples: tuple[str, ...] = Field(
        default=(), description="the first failed requests' words (what failed, for a person)"
    )
    total_output_tokens: int
    output_throughput: float = Field(description="decode tok/s, all requests together")
    per_request_throughput: float = Field(description="mean tok/s of one request's decode")
    mean_ttft_ms: float
    median_ttft_ms: float
    p90_ttft_ms: float
    p99_ttft_ms: float
    median_itl_ms: float
    effective_concurrency: float = Field(description="mean requests in flight during the window")
    accepted_per_step: float | None = Field(
        default=None, description="1 + accepted draft tokens per verify step, from /metrics deltas"
    )
    acceptance_rate: float | None = Field(
        default=None, description="accepted / drafted tokens, from /metrics deltas"
    )
    per_position_acceptance: tuple[float, ...] = ()
    clocks: tuple[NodeClockRecord, ...] = ()
    fingerprints: dict[str, str] = Field(
        default_factory=dict, description="prompt id → sha256 of the greedy text"
    )
    client_stall_s: float = Field(
        default=0.0, description="seconds of the window the measuring client was off the CPU"
    )
    engine_stall_s: float = Field(
        default=0.0,
        description="seconds the engine reported its scheduler late from the cell's start to"
        " the window's end (an engine that reports it: the twin)",
    )
    measured_again: int = Field(
        default=0,
        description="measurements of this cell dropped because the client or the engine stalled"
        " or, once, because every failed request of the window lost its connection",
    )
    engine_found_stopped: int = Field(
        default=0,
        description="of measured_again, the measurements dropped because an engine was found"
        " stopped while the cell waited on it (a kill -STOP, a debugger: its node's, neither the"
        " config's nor a busy host's); 0 in readings recorded before it was counted",
    )


class LlmUsage(BaseModel):
    """What a proposal's LLM calls used and cost: the typed face of its ``llm_*`` notes.

    The ledger stores it as the proposal's notes, in the words and formats it always had
    (``llm_cost_usd: "0.013500"``), so older ledgers read back as this record and this record
    writes back the same bytes.
    """

    model_config = ConfigDict(frozen=True)

    model: str
    requests: int = 0  # HTTP requests that got an answer or gave up
    api_retries: int = 0  # the SDK's retries
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    cost_usd: float = 0.0  # this proposal
    round_spend_usd: float = 0.0  # the round so far, this proposal included
    tries: int = 0  # proposals the model made
    rejected: int = 0  # how many of them were refused
    rejections: str | None = None  # the reasons, when there were any
    cap_usd: float | None = None  # the round's spend cap, when there is one
    fallback: str | None = None  # why another proposer made the proposal

    _COUNTS: ClassVar[tuple[str, ...]] = (
        "requests",
        "api_retries",
        "input_tokens",
        "output_tokens",
        "cache_read_tokens",
        "cache_write_tokens",
    )

    def to_notes(self) -> dict[str, str]:
        """The proposal notes this usage is stored as (every value a string)."""
        notes = {"llm_model": self.model}
        notes.update({f"llm_{key}": str(getattr(self, key)) for key in self._COUNTS})
        notes["llm_cost_usd"] = f"{self.cost_usd:.6f}"
        notes["llm_round_spend_usd"] = f"{self.round_spend_usd:.6f}"
        notes["llm_tries"] = str(self.tries)
        notes["llm_rejected"] = str(self.rejected)
        if self.rejections is not None:
            notes["llm_rejections"] = self.rejections
        if self.cap_usd is not None:
            notes["llm_cap_usd"] = f"{self.cap_usd:.6f}"
        if self.fallback is not None:
            notes["llm_fallback"] = self.fallback
        return notes

    @classmethod
    def from_notes(cls, notes: Mapping[str, str]) -> LlmUsage | None:
        """The usage a proposal's notes record (``None``: no LLM was asked). Never raises: a
        note that is not a finite, non-negative number reads as zero (or as absent)."""
        if "llm_model" not in notes:
            return None

        def number(key: str) -> float | None:
            try:
                value = float(notes[f"llm_{key}"])
            except (KeyError, ValueError):
                return None
            return value if math.isfinite(value) and value >= 0 else None

        counts = {key: int(number(key) or 0) for key in (*cls._COUNTS, "tries", "rejected")}
        return cls(
            model=notes["llm_model"],
            **counts,
            cost_usd=number("cost_usd") or 0.0,
            round_spend_usd=number("round_spend_usd") or 0.0,
            rejections=notes.get("llm_rejections"),
            cap_usd=number("cap_usd"),
            fallback=notes.get("llm_fallback"),
        )
