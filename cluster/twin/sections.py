"""The sections of a landscape file: one frozen pydantic model per YAML mapping, and what each
field of it accepts.

A landscape (``cluster.twin.landscape``) is made of these: the topology and time scales, the
engine's defaults, acceptance, decode and prefill timing, boot phases and failures, noise and
traps. This module owns what a section's fields must be (their ranges, acceptance that never
rises with position, the categories it must name) and which knobs the twin understands
(``KNOBS``); docs/twin.md says what each field is and where its number comes from.

Imports the standard library, ``pydantic``, ``knobs`` and ``cluster.prompts`` only: it runs on
every node.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

from cluster import prompts
from knobs.records import Category
from knobs.spec import Value

#: The knob names of the catalog the twin understands (others are accepted and have no effect).
KNOBS = (
    "num_speculative_tokens",
    "max_num_batched_tokens",
    "cuda_graphs",
    "drafter_adapter_rank",
    "kv_cache_dtype",
    "gpu_memory_utilization",
)


class StrictModel(BaseModel):
    """A mapping of a landscape file: frozen, and a field it does not know is refused."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class TimeScale(StrictModel):
    """Real seconds per twin second: boots and token rates run this many times faster."""

    boot: float = Field(gt=0)
    run: float = Field(gt=0)


class Topology(StrictModel):
    """The stack's shape: one GPU per node (DGX Spark), TP across nodes."""

    tensor_parallel_size: int = Field(ge=1)
    nnodes: int = Field(ge=1)
    gpus_per_node: int = Field(default=1, ge=1)


class EngineDefaults(StrictModel):
    """What the engine uses for a flag the command line leaves out (vLLM's defaults)."""

    max_num_batched_tokens: int = Field(default=8192, ge=1)
    kv_cache_dtype: str = "auto"
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)
    max_model_len: int = Field(default=262144, ge=1)


class Acceptance(StrictModel):
    """Per-category per-position acceptance at K=7 and the multipliers that act on it."""

    positions: dict[Category, tuple[float, ...]]
    adapter_rank: dict[int, float] = Field(default_factory=dict)
    kv_cache_dtype: dict[str, float] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _shape(self) -> Acceptance:
        missing = [c for c in prompts.CATEGORIES if c not in self.positions]
        if missing:
            raise ValueError(f"positions lacks categories: {', '.join(missing)}")
        for category, values in self.positions.items():
            if not values or any(not 0 <= p <= 1 for p in values):
                raise ValueError(f"positions.{category}: every value must lie in [0, 1]")
            if any(b > a + 1e-12 for a, b in itertools.pairwise(values)):
                raise ValueError(f"positions.{category}: acceptance cannot rise with position")
        return self


class KvDecode(StrictModel):
    """A KV dtype's effect on a decode step: on the context (KV read) term and on the whole."""

    context: float = Field(default=1.0, gt=0)
    step: float = Field(default=1.0, gt=0)


class Decode(StrictModel):
    """Step time of one verify step, in real milliseconds (see docs/twin.md for the equation)."""

    base_ms: float = Field(gt=0)
    draft_ms: float = Field(ge=0)
    draft_step_ms: float = Field(default=0.0, ge=0)
    verify_token_ms: float = Field(ge=0)
    draft_token_ms: float = Field(ge=0)
    request_ms: float = Field(ge=0)
    context_ms_per_1k: float = Field(ge=0)
    cuda_graphs_factor: float = Field(gt=0)
    cuda_graphs_factor_per_request: float = 0.0
    kv_cache_dtype: dict[str, KvDecode] = Field(default_factory=dict)
    mnbt_reference: int = Field(default=8192, ge=1)
    mnbt_penalty_per_1k: float = Field(default=0.0, ge=0)
    #: adapter rank → a factor on the drafter's share of a step (``draft_ms``, ``draft_step_ms``
    #: and ``draft_token_ms``; missing: 1.0): a bigger adapter drafts slower
    adapter_rank_draft: dict[int, Annotated[float, Field(gt=0)]] = Field(default_factory=dict)


class Cliff(StrictModel):
    """A prefill cliff: prompts of ``min_context`` tokens or more with MNBT below ``below_mnbt``."""

    min_context: int = Field(ge=1)
    below_mnbt: int = Field(ge=1)
    factor: float = Field(ge=1)


class Prefill(StrictModel):
    """Prefill time of one prompt, chunked by MNBT, in real milliseconds."""

    base_ms: float = Field(ge=0)
    chunk_ms: float = Field(ge=0)
    tokens_per_s: float = Field(gt=0)
    superlinear: float = Field(default=0.0, ge=0)
    kv_cache_dtype: dict[str, float] = Field(default_factory=dict)
    cliff: Cliff | None = None
    #: seconds added to the first prefill after boot: a backend that compiles its batch
    #: shapes on first use (vLLM's CPU backend) answers its first request late
    cold_first_s: float = Field(default=0.0, ge=0)
    #: seconds added to the first decode step after boot, for every request in flight: a
    #: backend that compiles its decode path on first use goes quiet after the first token
    cold_decode_s: float = Field(default=0.0, ge=0)


class Boot(StrictModel):
    """Boot phases (real seconds), rendezvous timing and the ways a boot fails."""

    worker_init_s: float = Field(ge=0)
    rendezvous_timeout_s: float = Field(gt=0)
    worker_wait_s: float = Field(gt=0)
    load_s: float = Field(ge=0)
    compile_s: float = Field(ge=0)
    kv_profile_s: float = Field(ge=0)
    graph_capture_s: float = Field(ge=0)
    oom_gpu_memory_utilization: float = Field(gt=0, le=1.01)
    weights_fraction: float = Field(ge=0, lt=1)
    kv_min_utilization: dict[str, float] = Field(default_factory=dict)
    device_gib: float = Field(default=119.7, gt=0)
    weights_gib: float = Field(default=58.6, gt=0)
    mask_token_id: int = 154856
    requires: dict[str, tuple[Value, ...]] = Field(default_factory=dict)


class Noise(StrictModel):
    """Spreads (relative standard deviations) and the stuck-clock fault."""

    run_to_run: float = Field(default=0.02, ge=0, le=1)
    boot_to_boot: float = Field(default=0.05, ge=0, le=1)
    acceptance: float = Field(default=0.004, ge=0, le=1)
    stuck_clock_probability: float = Field(default=0.0, ge=0, le=1)
    stuck_clock_rate: float = Field(default=0.75, gt=0, le=1)


class Trap(StrictModel):
    """A configuration that is fast because it is wrong: position 0 pinned, greedy text changed."""

    when: dict[str, Value] = Field(min_length=1)
    position_0: float = Field(default=1.0, ge=0, le=1)
    step_factor: float = Field(default=1.0, gt=0)
    reason: str

    def matches(self, config: Mapping[str, Value]) -> bool:
        """Whether ``config`` falls in this trap."""
        return all(k in config and config[k] == v for k, v in self.when.items())
