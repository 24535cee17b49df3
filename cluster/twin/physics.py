"""The twin's equations: a configuration resolved, whether it boots, and how fast it serves.

``Landscape`` (``cluster.twin.landscape``) holds the numbers; this module holds what is done
with them (docs/twin.md writes the equations out). The engine and the ground truth share one
``EngineModel`` per configuration, so what the engine serves and what ``truth`` says can never
disagree.

Imports the standard library and ``knobs`` only: it runs on every node.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from knobs.records import Category, CellSpec
from knobs.spec import Value

if TYPE_CHECKING:
    from cluster.twin.landscape import Landscape
    from cluster.twin.sections import Trap

BootStatus = Literal["ok", "oom", "kv_capacity", "wedge"]


@dataclass(frozen=True)
class Settings:
    """A configuration resolved to what the model needs (knob names of the catalog)."""

    num_speculative_tokens: int
    max_num_batched_tokens: int
    cuda_graphs: bool
    drafter_adapter_rank: int
    kv_cache_dtype: str
    gpu_memory_utilization: float
    max_model_len: int

    @classmethod
    def resolve(
        cls, config: Mapping[str, object], defaults: Mapping[str, Value], max_model_len: int
    ) -> Settings:
        """``config`` resolved: a knob it leaves out takes its value in ``defaults``; a knob the
        twin does not know is ignored; vLLM's spellings of the KV dtype are the catalog's.

        Raises:
            TypeError, ValueError: a value of the wrong type for its knob (the message names it).
        """

        def get(name: str) -> object:
            return config[name] if name in config else defaults.get(name)

        return cls(
            num_speculative_tokens=_as_int(get("num_speculative_tokens"), "num_speculative_tokens"),
            max_num_batched_tokens=_as_int(get("max_num_batched_tokens"), "max_num_batched_tokens"),
            cuda_graphs=_as_bool(get("cuda_graphs"), "cuda_graphs"),
            drafter_adapter_rank=_as_int(get("drafter_adapter_rank"), "drafter_adapter_rank"),
            kv_cache_dtype=_kv_name(str(get("kv_cache_dtype"))),
            gpu_memory_utilization=_as_float(
                get("gpu_memory_utilization"), "gpu_memory_utilization"
            ),
            max_model_len=max_model_len,
        )

    def as_config(self) -> dict[str, Value]:
        """The six knobs as a config mapping."""
        return {
            "num_speculative_tokens": self.num_speculative_tokens,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "cuda_graphs": self.cuda_graphs,
            "drafter_adapter_rank": self.drafter_adapter_rank,
            "kv_cache_dtype": self.kv_cache_dtype,
            "gpu_memory_utilization": self.gpu_memory_utilization,
        }


def _as_int(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise TypeError(f"{name}: {value!r} is not an integer")
    number = float(value)
    if not number.is_integer():
        raise ValueError(f"{name}: {value!r} is not an integer")
    return int(number)


def _as_float(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise TypeError(f"{name}: {value!r} is not a number")
    return float(value)


def _as_bool(value: object, name: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise TypeError(f"{name}: {value!r} is not true or false")


def _kv_name(value: str) -> str:
    """vLLM's spellings of the KV dtype, as the catalog names them."""
    return {"fp8": "fp8_e4m3", "bfloat16": "auto", "bf16": "auto"}.get(value, value)


@dataclass(frozen=True)
class BootGate:
    """Whether a boot ends well, by memory level: the one rule of which configurations boot.

    ``Landscape.boot_gate`` builds it; ``boot_status`` (and through it the twin's boot and the
    simulated testbed) and ``optimum`` apply it.
    """

    oom_from: float  # the gpu_memory_utilization from which the boot runs out of memory
    kv_need: float | None  # the least level whose KV cache holds a max_model_len sequence
    wedge: str  # why the boot wedges on this stack (boot.requires), or ""

    def status(self, gpu_memory_utilization: float) -> BootStatus:
        """How a boot at ``gpu_memory_utilization`` ends."""
        u = gpu_memory_utilization
        if u >= self.oom_from - 1e-9:
            return "oom"
        if self.kv_need is not None and u < self.kv_need - 1e-9:
            return "kv_capacity"
        if self.wedge:
            return "wedge"
        return "ok"

    def reason(self, status: BootStatus, settings: Settings) -> str:
        """Why a boot of ``settings`` ends with ``status`` (an empty reason when it boots)."""
        u = settings.gpu_memory_utilization
        if status == "oom":
            return f"gpu_memory_utilization {u:g} >= {self.oom_from:g} runs out of memory"
        if status == "kv_capacity":
            return (
                f"gpu_memory_utilization {u:g} leaves too little KV cache for max_model_len "
                f"{settings.max_model_len} with kv_cache_dtype {settings.kv_cache_dtype} "
                f"(needs {self.kv_need:.3f})"
            )
        if status == "wedge":
            return self.wedge
        return ""


@dataclass(frozen=True)
class CellTruth:
    """The noise-free outcome of one configuration on one cell.

    ``output_tok_s`` is what the bench client measures in the cell's window with noise off
    (twin seconds: real rates × the run time scale); ``steady_tok_s`` is the closed-form
    steady state it converges to for long windows. Both are 0 when the config does not boot.
    """

    cell: str
    status: BootStatus
    reason: str
    invalid: bool
    output_tok_s: float
    steady_tok_s: float
    accepted_per_step: float
    per_position: tuple[float, ...]
    ttft_s: float
    step_s: float

    @property
    def boots(self) -> bool:
        """The engine becomes healthy (it may still be the invalid trap)."""
        return self.status == "ok"

    @property
    def wedges(self) -> bool:
        """The boot hangs: never healthy, never exits."""
        return self.status == "wedge"

    @property
    def ooms(self) -> bool:
        """The boot dies out of memory."""
        return self.status == "oom"

    @property
    def valid(self) -> bool:
        """Boots and serves correct greedy text."""
        return self.boots and not self.invalid

    @property
    def acceptance_rate(self) -> float:
        """Accepted / drafted tokens."""
        k = len(self.per_position)
        return (self.accepted_per_step - 1) / k if k else 0.0


@dataclass(frozen=True)
class EngineModel:
    """The model of one configuration: prefill and step times, acceptance, trap.

    Times are twin seconds at speed 1 (divide by a speed factor for noise and clocks).
    """

    landscape: Landscape
    settings: Settings
    trap: Trap | None
    _positions: dict[str, tuple[float, ...]] = field(default_factory=dict, compare=False)

    @property
    def k(self) -> int:
        """Draft tokens per step (0 without speculative decoding)."""
        return self.settings.num_speculative_tokens

    def positions(self, category: Category) -> tuple[float, ...]:
        """Per-position acceptance P(position i accepted), i < K, for ``category``."""
        cached = self._positions.get(category)
        if cached is not None:
            return cached
        acc = self.landscape.acceptance
        s = self.settings
        base = acc.positions[category]
        mult = acc.adapter_rank.get(s.drafter_adapter_rank, 1.0) * acc.kv_cache_dtype.get(
            s.kv_cache_dtype, 1.0
        )
        values = [
            min(1.0, (base[i] if i < len(base) else 0.0) * mult)
            for i in range(s.num_speculative_tokens)
        ]
        if self.trap is not None and values:
            p0 = values[0]
            values = [self.trap.position_0] + [
                min(1.0, v / p0) if p0 > 0 else 0.0 for v in values[1:]
            ]
        out = tuple(values)
        self._positions[category] = out
        return out

    def accepted_per_step(self, category: Category) -> float:
        """Tokens per verify step: 1 + Σ P(position i accepted)."""
        return 1.0 + sum(self.positions(category))

    @property
    def cold_first_s(self) -> float:
        """Seconds the first prefill after boot takes on top of its own (twin seconds)."""
        return self.landscape.prefill.cold_first_s / self.landscape.time_scale.run

    @property
    def cold_decode_s(self) -> float:
        """Seconds the first decode step after boot waits on top of its own (twin seconds)."""
        return self.landscape.prefill.cold_decode_s / self.landscape.time_scale.run

    def prefill_s(self, prompt_tokens: int) -> float:
        """Prefill time of a ``prompt_tokens`` prompt (the time to first token with no queue)."""
        p = self.landscape.prefill
        m = max(1, self.settings.max_num_batched_tokens)
        ms = p.base_ms
        left = prompt_tokens
        while left > 0:
            x = min(m, left)
            ms += p.chunk_ms + x / p.tokens_per_s * 1000.0 * (1.0 + p.superlinear * x / 8192.0)
            left -= x
        ms *= p.kv_cache_dtype.get(self.settings.kv_cache_dtype, 1.0)
        if p.cliff is not None and prompt_tokens >= p.cliff.min_context and m < p.cliff.below_mnbt:
            ms *= p.cliff.factor
        return ms / 1000.0 / self.landscape.time_scale.run

    def step_s(self, running: int, context_tokens: int) -> float:
        """One verify step with ``running`` requests holding ``context_tokens`` prompt tokens."""
        d = self.landscape.decode
        s = self.settings
        n = max(1, running)
        k = s.num_speculative_tokens
        drafting = d.adapter_rank_draft.get(s.drafter_adapter_rank, 1.0)
        ms = (
            d.base_ms
            + ((d.draft_ms if k > 0 else 0.0) + d.draft_step_ms * k) * drafting
            + n * (d.verify_token_ms * (k + 1) + d.draft_token_ms * k * drafting)
            + d.request_ms * (n - 1)
        )
        kv = d.kv_cache_dtype.get(s.kv_cache_dtype)
        ms += d.context_ms_per_1k * context_tokens / 1000.0 * (kv.context if kv else 1.0)
        ms *= kv.step if kv else 1.0
        if s.cuda_graphs:
            ms *= d.cuda_graphs_factor + d.cuda_graphs_factor_per_request * (n - 1)
        over = max(0, s.max_num_batched_tokens - d.mnbt_reference) / 1024.0
        ms *= 1.0 + d.mnbt_penalty_per_1k * over * min(1.0, (n - 1) / 7.0)
        if self.trap is not None:
            ms *= self.trap.step_factor
        return ms / 1000.0 / self.landscape.time_scale.run


def decode_steps(max_tokens: int, accepted: float) -> int:
    """Verify steps after prefill to emit ``max_tokens`` (prefill emits the first token)."""
    if max_tokens <= 1:
        return 0
    return math.ceil((max_tokens - 1) / accepted - 1e-9)


def tokens_after(steps: int, accepted: float, max_tokens: int) -> int:
    """Tokens a request has received once prefill and ``steps`` verify steps are done."""
    return 1 + min(max_tokens - 1, math.floor(steps * accepted + 1e-9))


def window_tokens(
    prefill: float, step: float, accepted: float, cell: CellSpec
) -> tuple[float, float]:
    """``(tokens in the window, steady-state tok/s)`` of a saturated cell with no client gaps.

    ``cell.concurrency`` streams start together at 0; prefill is first-come first-served one
    prompt at a time; each stream sends its next request the moment the last one completes;
    tokens are counted between ``warmup_s`` and ``warmup_s + duration_s``.
    """
    c, m = cell.concurrency, cell.max_tokens
    steps = decode_steps(m, accepted)
    w0, w1 = cell.warmup_s, cell.warmup_s + cell.duration_s

    def received(t: float, first: float) -> int:
        if t < first:
            return 0
        done = min(steps, math.floor((t - first) / step + 1e-9))
        return tokens_after(done, accepted, m)

    arrivals = [(0.0, i) for i in range(c)]
    heapq.heapify(arrivals)
    free = 0.0
    total = 0
    while arrivals:
        arrival, stream = heapq.heappop(arrivals)
        if arrival >= w1:
            continue
        first = max(arrival, free) + prefill
        free = first
        total += received(w1, first) - received(w0, first)
        heapq.heappush(arrivals, (first + steps * step, stream))
    cycle = max(prefill + steps * step, c * prefill)
    return float(total), c * m / cycle
