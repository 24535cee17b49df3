"""Records that cross package boundaries: bench cells and their measured results.

They live here, in the bottom package, so that ``cluster`` (which measures), ``ledger``
(which stores) and ``orchestrator`` (which judges) share one typed vocabulary.
Field names follow vLLM's ``bench serve`` result JSON where one exists.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Category = Literal["prose", "code", "structured", "agentic"]


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
