"""Landscapes: the twin's performance model as data, and its ground truth.

A landscape (YAML, one file per stack) holds every number of the model; this module holds the
equations (docs/twin.md writes them out). The engine and the ground truth share one
``EngineModel`` per configuration, so what the engine serves and what ``truth`` says can never
disagree.

Imports the standard library, ``yaml``, ``pydantic``, ``knobs`` and ``cluster.prompts`` only: it
runs on every node (an import contract in pyproject.toml checks the twin's imports).
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from cluster import prompts
from cluster.twin import noise, text
from knobs.catalog import catalog
from knobs.errors import KnobError, ProfileError
from knobs.records import Category, CellResultRecord, CellSpec
from knobs.space import KnobSpace
from knobs.spec import Value

#: Where the shipped landscapes live.
LANDSCAPES_DIR = Path(__file__).resolve().parent / "landscapes"

#: The landscape a bare ``optimum`` (and a twin launcher without ``TWIN_LANDSCAPE``) uses.
DEFAULT_LANDSCAPE = "vllm-dflash2-tp4"

#: The knob names of the catalog the twin understands (others are accepted and have no effect).
KNOBS = (
    "num_speculative_tokens",
    "max_num_batched_tokens",
    "cuda_graphs",
    "drafter_adapter_rank",
    "kv_cache_dtype",
    "gpu_memory_utilization",
)

#: The memory knob: it decides whether a configuration boots, never how fast it serves.
_MEMORY = "gpu_memory_utilization"

BootStatus = Literal["ok", "oom", "kv_capacity", "wedge"]


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class TimeScale(_Model):
    """Real seconds per twin second: boots and token rates run this many times faster."""

    boot: float = Field(gt=0)
    run: float = Field(gt=0)


class Topology(_Model):
    """The stack's shape: one GPU per node (DGX Spark), TP across nodes."""

    tensor_parallel_size: int = Field(ge=1)
    nnodes: int = Field(ge=1)
    gpus_per_node: int = Field(default=1, ge=1)


class EngineDefaults(_Model):
    """What the engine uses for a flag the command line leaves out (vLLM's defaults)."""

    max_num_batched_tokens: int = Field(default=8192, ge=1)
    kv_cache_dtype: str = "auto"
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)
    max_model_len: int = Field(default=262144, ge=1)


class Acceptance(_Model):
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


class KvDecode(_Model):
    """A KV dtype's effect on a decode step: on the context (KV read) term and on the whole."""

    context: float = Field(default=1.0, gt=0)
    step: float = Field(default=1.0, gt=0)


class Decode(_Model):
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


class Cliff(_Model):
    """A prefill cliff: prompts of ``min_context`` tokens or more with MNBT below ``below_mnbt``."""

    min_context: int = Field(ge=1)
    below_mnbt: int = Field(ge=1)
    factor: float = Field(ge=1)


class Prefill(_Model):
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


class Boot(_Model):
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


class Noise(_Model):
    """Spreads (relative standard deviations) and the stuck-clock fault."""

    run_to_run: float = Field(default=0.02, ge=0, le=1)
    boot_to_boot: float = Field(default=0.05, ge=0, le=1)
    acceptance: float = Field(default=0.004, ge=0, le=1)
    stuck_clock_probability: float = Field(default=0.0, ge=0, le=1)
    stuck_clock_rate: float = Field(default=0.75, gt=0, le=1)


class Trap(_Model):
    """A configuration that is fast because it is wrong: position 0 pinned, greedy text changed."""

    when: dict[str, Value] = Field(min_length=1)
    position_0: float = Field(default=1.0, ge=0, le=1)
    step_factor: float = Field(default=1.0, gt=0)
    reason: str

    def matches(self, config: Mapping[str, Value]) -> bool:
        """Whether ``config`` falls in this trap."""
        return all(k in config and config[k] == v for k, v in self.when.items())


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
        kv = d.kv_cache_dtype.get(s.kv_cache_dtype, KvDecode())
        ms += d.context_ms_per_1k * context_tokens / 1000.0 * kv.context
        ms *= kv.step
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


class Landscape(_Model):
    """One stack's performance landscape (see docs/twin.md for every field and its source)."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    description: str = ""
    catalog: str = "vllm-dflash2"
    topology: Topology
    time_scale: TimeScale
    engine_defaults: EngineDefaults = Field(default_factory=EngineDefaults)
    acceptance: Acceptance
    decode: Decode
    prefill: Prefill
    boot: Boot
    noise: Noise = Field(default_factory=Noise)
    traps: tuple[Trap, ...] = ()
    reference_cells: tuple[CellSpec, ...] = Field(min_length=1)

    _cache: dict[tuple[object, ...], CellTruth] = PrivateAttr(default_factory=dict)
    _defaults: dict[str, Value] = PrivateAttr(default_factory=dict)

    @model_validator(mode="after")
    def _consistent(self) -> Landscape:
        names = [c.name for c in self.reference_cells]
        if len(set(names)) != len(names):
            raise ValueError("reference_cells: cell names must be unique")
        for trap in self.traps:
            for knob in trap.when:
                if knob not in KNOBS:
                    raise ValueError(f"traps: unknown knob {knob!r}; known: {', '.join(KNOBS)}")
        for knob in self.boot.requires:
            if knob not in KNOBS:
                raise ValueError(f"boot.requires: unknown knob {knob!r}; known: {', '.join(KNOBS)}")
        try:
            catalog(self.catalog)
        except KnobError as e:
            raise ValueError(str(e)) from None
        return self

    # ---- noise parameters as attributes ----------------------------------------------------
    @property
    def run_to_run(self) -> float:
        """Relative SD of one measurement around its boot's level."""
        return self.noise.run_to_run

    @property
    def boot_to_boot(self) -> float:
        """Relative SD of a boot's level around the truth."""
        return self.noise.boot_to_boot

    @property
    def acceptance_noise(self) -> float:
        """Relative SD of accepted draft tokens per step, run to run."""
        return self.noise.acceptance

    @property
    def stuck_clock_probability(self) -> float:
        """Probability that a node comes up with stuck clocks at a boot."""
        return self.noise.stuck_clock_probability

    @property
    def stuck_clock_rate(self) -> float:
        """Matmul rate of a node with stuck clocks (1.0 is healthy)."""
        return self.noise.stuck_clock_rate

    # ---- the space and the cells -----------------------------------------------------------
    def knob_space(self) -> KnobSpace:
        """The knob domains a proposer searches (the landscape's catalog, no constraints)."""
        return KnobSpace(knobs=catalog(self.catalog))

    def cells(self) -> list[CellSpec]:
        """The landscape's reference cells (the twin profile's bench cells)."""
        return list(self.reference_cells)

    def with_time_scale(self, *, boot: float | None = None, run: float | None = None) -> Landscape:
        """A copy with other time scales (``TWIN_BOOT_SCALE`` / ``TWIN_RUN_SCALE``)."""
        scale = TimeScale(
            boot=self.time_scale.boot if boot is None else boot,
            run=self.time_scale.run if run is None else run,
        )
        copy = self.model_copy(update={"time_scale": scale})
        copy._cache = {}
        return copy

    def without_noise(self) -> Landscape:
        """A copy with every spread and the stuck-clock probability at 0 (``TWIN_NOISE=0``)."""
        quiet = self.noise.model_copy(
            update={
                "run_to_run": 0.0,
                "boot_to_boot": 0.0,
                "acceptance": 0.0,
                "stuck_clock_probability": 0.0,
            }
        )
        copy = self.model_copy(update={"noise": quiet})
        copy._cache = {}
        return copy

    # ---- configurations --------------------------------------------------------------------
    def settings(
        self, config: Mapping[str, object], *, max_model_len: int | None = None
    ) -> Settings:
        """``config`` resolved: missing knobs take the knob space's defaults; others are ignored.

        Raises:
            KnobError: a value of the wrong type for its knob.
        """
        if not self._defaults:
            self._defaults.update({k.name: k.default for k in self.knob_space().knobs})
        defaults = self._defaults

        def get(name: str) -> object:
            return config[name] if name in config else defaults.get(name)

        try:
            return Settings(
                num_speculative_tokens=_as_int(
                    get("num_speculative_tokens"), "num_speculative_tokens"
                ),
                max_num_batched_tokens=_as_int(
                    get("max_num_batched_tokens"), "max_num_batched_tokens"
                ),
                cuda_graphs=_as_bool(get("cuda_graphs"), "cuda_graphs"),
                drafter_adapter_rank=_as_int(get("drafter_adapter_rank"), "drafter_adapter_rank"),
                kv_cache_dtype=_kv_name(str(get("kv_cache_dtype"))),
                gpu_memory_utilization=_as_float(
                    get("gpu_memory_utilization"), "gpu_memory_utilization"
                ),
                max_model_len=max_model_len or self.engine_defaults.max_model_len,
            )
        except (TypeError, ValueError) as e:
            raise KnobError(f"landscape {self.name}: {e}") from None

    def boot_status(self, settings: Settings) -> tuple[BootStatus, str]:
        """How a boot of ``settings`` ends, and why (an empty reason when it boots)."""
        gate = self.boot_gate(settings)
        status = gate.status(settings.gpu_memory_utilization)
        return status, gate.reason(status, settings)

    def boot_gate(self, settings: Settings) -> BootGate:
        """What decides whether ``settings`` boots: the rule ``boot_status`` applies.

        The gate depends on the memory level only through ``wedge`` (when ``boot.requires``
        names ``gpu_memory_utilization``); otherwise one gate serves every level.
        """
        return BootGate(
            oom_from=self.boot.oom_gpu_memory_utilization,
            kv_need=self.kv_min_utilization(settings),
            wedge=self.wedge_reason(settings),
        )

    def wedge_reason(self, settings: Settings) -> str:
        """Why ``settings`` wedges the boot on this stack (``boot.requires``), or ``""``."""
        if not self.boot.requires:
            return ""
        config = settings.as_config()
        for knob, allowed in self.boot.requires.items():
            if config[knob] not in allowed:
                shown = ", ".join(str(v) for v in allowed)
                return f"{knob}={config[knob]} wedges the boot on this stack (must be {shown})"
        return ""

    def kv_min_utilization(self, settings: Settings) -> float | None:
        """The least utilisation whose KV cache holds a ``max_model_len`` sequence, if modelled."""
        at_ref = self.boot.kv_min_utilization.get(settings.kv_cache_dtype)
        if at_ref is None:
            return None
        w = self.boot.weights_fraction
        ratio = settings.max_model_len / self.engine_defaults.max_model_len
        return w + (at_ref - w) * ratio

    def trap_for(self, settings: Settings) -> Trap | None:
        """The trap ``settings`` falls into, if any."""
        config = settings.as_config()
        for trap in self.traps:
            if trap.matches(config):
                return trap
        return None

    def engine_model(self, settings: Settings) -> EngineModel:
        """The model the engine serves ``settings`` with."""
        return EngineModel(landscape=self, settings=settings, trap=self.trap_for(settings))

    # ---- ground truth ----------------------------------------------------------------------
    def truth(self, config: Mapping[str, object], cell: CellSpec) -> CellTruth:
        """The noise-free outcome of ``config`` on ``cell``.

        Raises:
            KnobError: a value of the wrong type for its knob.
        """
        return self._truth(self.settings(config), cell)

    def _truth(self, settings: Settings, cell: CellSpec) -> CellTruth:
        status, reason = self.boot_status(settings)
        perf = self._perf(settings, cell)
        if status == "ok":
            return perf
        return dataclasses.replace(
            perf, status=status, reason=reason, output_tok_s=0.0, steady_tok_s=0.0
        )

    def _perf(self, settings: Settings, cell: CellSpec) -> CellTruth:
        """The truth of ``settings`` on ``cell`` as if it booted (the memory knob plays no part)."""
        model = self.engine_model(settings)
        # configurations the model cannot tell apart share one entry (e.g. adapter ranks with
        # equal multipliers): the memory knob, the rank itself and the context limit play no part
        key = (
            settings.num_speculative_tokens,
            settings.max_num_batched_tokens,
            settings.cuda_graphs,
            settings.kv_cache_dtype,
            self.acceptance.adapter_rank.get(settings.drafter_adapter_rank, 1.0),
            self.decode.adapter_rank_draft.get(settings.drafter_adapter_rank, 1.0),
            self.traps.index(model.trap) if model.trap is not None else -1,
            cell,
        )
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        positions = model.positions(cell.category)
        accepted = 1.0 + sum(positions)
        tokens = prompts.prompt_tokens(cell.context_tokens)
        prefill = model.prefill_s(tokens)
        step = model.step_s(cell.concurrency, cell.concurrency * tokens)
        window, steady = window_tokens(prefill, step, accepted, cell)
        out = CellTruth(
            cell=cell.name,
            status="ok",
            reason=model.trap.reason if model.trap else "",
            invalid=model.trap is not None,
            output_tok_s=window / cell.duration_s,
            steady_tok_s=steady,
            accepted_per_step=accepted,
            per_position=positions,
            ttft_s=prefill,
            step_s=step,
        )
        if len(self._cache) > 100_000:
            self._cache.clear()
        self._cache[key] = out
        return out

    def objective(
        self, config: Mapping[str, object], cells: Sequence[CellSpec] | None = None
    ) -> float | None:
        """Sum of noise-free output tok/s over ``cells`` (default: the reference cells).

        ``None`` when the config does not boot (OOM, KV capacity, wedge). The trap boots and
        has an objective; ``truth(...).invalid`` says it is wrong.

        Raises:
            KnobError: a value of the wrong type for its knob.
        """
        settings = self.settings(config)
        if self.boot_status(settings)[0] != "ok":
            return None
        chosen = self.cells() if cells is None else cells
        return sum(self._perf(settings, cell).output_tok_s for cell in chosen)

    def optimum(self, cells: Sequence[CellSpec] | None = None) -> dict[str, Any]:
        """The best valid configuration of the knob space, per cell and in total.

        Ties (knobs with no served effect, e.g. the adapter rank) go to the configuration with
        the fewest knobs away from the knob space's defaults, then to the earliest in domain
        order. Also reports the default config, the fastest invalid config (the trap) and counts.

        Raises:
            ProfileError: no configuration of the knob space boots.
        """
        chosen = self.cells() if cells is None else list(cells)
        space = self.knob_space()
        names = space.names
        default = space.default_config()
        search = self._search(space, chosen)
        best, trap_best = search.best, search.trap_best
        if best is None:
            raise ProfileError(f"landscape {self.name}: no configuration of the knob space boots")
        out: dict[str, Any] = {
            "landscape": self.name,
            "time_scale": self.time_scale.model_dump(),
            "config": {n: best[2][n] for n in names},
            "objective": best[0],
            "cells": self._cell_report(best[2], chosen),
            "ties": search.ties,
            "default": {"config": default.as_dict(), "objective": self.objective(default, chosen)},
            "counts": search.counts,
        }
        if trap_best is not None:
            out["fastest_invalid"] = {
                "config": {n: trap_best[2][n] for n in names},
                "objective": trap_best[0],
                "reason": next(t.reason for t in self.traps if t.matches(trap_best[2])),
            }
        return out

    def _search(self, space: KnobSpace, cells: Sequence[CellSpec]) -> _Search:
        """Every configuration of ``space`` scored on ``cells``, noise-free.

        The memory knob changes whether a config boots, never how fast it serves: each
        combination of the other knobs is scored once, then tried at every memory level.
        """
        default = space.default_config()
        others = [k for k in space.knobs if k.name != _MEMORY]
        levels: list[Value | None] = (
            list(space.spec(_MEMORY).domain()) if _MEMORY in space.names else [None]
        )
        search = _Search()
        for values in itertools.product(*(k.domain() for k in others)):
            partial = dict(zip((k.name for k in others), values, strict=True))
            first = self.settings(
                {**partial, **({_MEMORY: levels[0]} if levels[0] is not None else {})}
            )
            total = sum(self._perf(first, cell).output_tok_s for cell in cells)
            trapped = self.trap_for(first) is not None
            moved_partial = sum(1 for n, v in partial.items() if v != default[n])
            for level, status in zip(levels, self._boot_statuses(first, levels), strict=True):
                config: dict[str, Value] = dict(partial)
                if level is not None:
                    config[_MEMORY] = level
                moved = moved_partial + (
                    1 if level is not None and level != default[_MEMORY] else 0
                )
                search.add(status, total, moved, config, trapped=trapped)
        return search

    def _boot_statuses(self, first: Settings, levels: Sequence[Value | None]) -> list[BootStatus]:
        """``boot_status`` of ``first`` at each memory level (``None``: ``first``'s own level)."""
        if _MEMORY not in self.boot.requires:
            # the level decides only oom and KV capacity: one gate serves every level
            gate = self.boot_gate(first)
            return [
                gate.status(first.gpu_memory_utilization if level is None else float(level))
                for level in levels
            ]
        return [
            self.boot_status(
                first
                if level is None
                else dataclasses.replace(first, gpu_memory_utilization=float(level))
            )[0]
            for level in levels
        ]

    def _cell_report(
        self, config: Mapping[str, object], cells: Sequence[CellSpec]
    ) -> list[dict[str, Any]]:
        rows = []
        for cell in cells:
            t = self.truth(config, cell)
            rows.append(
                {
                    "cell": cell.name,
                    "output_tok_s": t.output_tok_s,
                    "steady_tok_s": t.steady_tok_s,
                    "accepted_per_step": t.accepted_per_step,
                    "ttft_s": t.ttft_s,
                    "step_s": t.step_s,
                }
            )
        return rows

    # ---- noisy draws -----------------------------------------------------------------------
    def draw_boot_factor(self, generator: random.Random) -> float:
        """A boot's speed factor (median 1, spread ``boot_to_boot``)."""
        return noise.lognormal(generator, self.noise.boot_to_boot)

    def sample(
        self,
        config: Mapping[str, object],
        cell: CellSpec,
        rng: random.Random,
        boot_factor: float = 1.0,
    ) -> CellResultRecord | None:
        """One noisy measurement of ``config`` on ``cell``, as the bench client would record it.

        Throughput is the truth × ``boot_factor`` × a run-to-run factor drawn from ``rng``;
        accepted draft tokens per step get their own run-to-run factor. Fingerprints are the
        greedy texts' digests of the category's prompts (the trap's differ). ``None`` when the
        config does not boot.

        Raises:
            KnobError: a value of the wrong type for its knob.
        """
        settings = self.settings(config)
        t = self._truth(settings, cell)
        if not t.boots:
            return None
        speed = noise.lognormal(rng, self.noise.run_to_run) * boot_factor
        acc = noise.lognormal(rng, self.noise.acceptance)
        k = len(t.per_position)
        positions = tuple(min(1.0, p * acc) for p in t.per_position)
        accepted = 1.0 + sum(positions)
        scale = (accepted / t.accepted_per_step) * speed
        tok_s = t.output_tok_s * scale
        completed = max(1, round(tok_s * cell.duration_s / cell.max_tokens))
        decode_s = max(t.step_s / speed, 1e-9)
        ttft_ms = t.ttft_s / speed * 1000.0
        trap = t.invalid
        fingerprints = {}
        for i in range(len(prompts.base_prompts(cell.category))):
            p = prompts.build_prompt(cell.category, cell.context_tokens, i)
            fingerprints[p.id] = text.fingerprint(
                text.greedy_text(p.text, cell.max_tokens, trap=trap)
            )
        return CellResultRecord(
            cell=cell.name,
            category=cell.category,
            concurrency=cell.concurrency,
            context_tokens=cell.context_tokens,
            duration=cell.duration_s,
            completed=completed,
            errors=0,
            total_output_tokens=round(tok_s * cell.duration_s),
            output_throughput=tok_s,
            per_request_throughput=accepted / decode_s,
            mean_ttft_ms=ttft_ms,
            median_ttft_ms=ttft_ms,
            p90_ttft_ms=ttft_ms,
            p99_ttft_ms=ttft_ms,
            median_itl_ms=decode_s * 1000.0,
            effective_concurrency=float(cell.concurrency),
            accepted_per_step=accepted if k else None,
            acceptance_rate=(accepted - 1) / k if k else None,
            per_position_acceptance=positions,
            fingerprints=fingerprints,
        )

    # ---- boot timing (twin seconds) --------------------------------------------------------
    def boot_seconds(self, settings: Settings) -> float:
        """Twin seconds from rendezvous to healthy for ``settings`` (when it boots)."""
        b = self.boot
        real = (
            b.load_s
            + b.compile_s
            + b.kv_profile_s
            + (b.graph_capture_s if settings.cuda_graphs else 0.0)
        )
        return real / self.time_scale.boot

    def scaled(self, real_seconds: float) -> float:
        """A boot duration in twin seconds."""
        return real_seconds / self.time_scale.boot


@dataclass
class _Search:
    """``optimum``'s tally: the best valid and the best invalid config, counts and ties."""

    best: tuple[float, int, dict[str, Value]] | None = None
    trap_best: tuple[float, int, dict[str, Value]] | None = None
    ties: int = 0
    counts: dict[str, int] = field(
        default_factory=lambda: {
            "configs": 0,
            "valid": 0,
            "oom": 0,
            "kv_capacity": 0,
            "wedge": 0,
            "invalid": 0,
        }
    )

    def add(
        self,
        status: BootStatus,
        total: float,
        moved: int,
        config: dict[str, Value],
        *,
        trapped: bool,
    ) -> None:
        """One configuration: its boot status, objective and knobs away from the defaults."""
        self.counts["configs"] += 1
        if status != "ok":
            self.counts[status] += 1
            return
        if trapped:
            self.counts["invalid"] += 1
            if self.trap_best is None or _better(total, moved, self.trap_best):
                self.trap_best = (total, moved, config)
            return
        self.counts["valid"] += 1
        best = self.best
        if best is None or total > best[0] * (1 + 1e-9):
            self.best, self.ties = (total, moved, config), 1
        elif total >= best[0] * (1 - 1e-9):
            self.ties += 1
            if moved < best[1]:
                self.best = (total, moved, config)


def _better(total: float, moved: int, than: tuple[float, int, object]) -> bool:
    """Whether ``(total, moved)`` beats ``than``: higher total, or a tie with fewer knobs moved."""
    if total > than[0] * (1 + 1e-9):
        return True
    return total >= than[0] * (1 - 1e-9) and moved < than[1]


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


def shipped() -> list[str]:
    """Names of the landscapes shipped with the twin."""
    return sorted(p.stem for p in LANDSCAPES_DIR.glob("*.yaml"))


def landscape_path(path_or_name: str | Path) -> Path:
    """The file of a shipped landscape name, or ``path_or_name`` itself when it is a file.

    Raises:
        ProfileError: neither a file nor a shipped name.
    """
    candidate = Path(path_or_name)
    if candidate.is_file():
        return candidate
    named = LANDSCAPES_DIR / f"{path_or_name}.yaml"
    if isinstance(path_or_name, str) and "/" not in path_or_name and named.is_file():
        return named
    raise ProfileError(
        f"landscape {str(path_or_name)!r}: no such file and not a shipped landscape "
        f"({', '.join(shipped())}); give a YAML path or one of those names",
        path=str(path_or_name),
    )


def load_landscape(path_or_name: str | Path) -> Landscape:
    """Load and validate a landscape from a YAML path or a shipped name.

    Raises:
        ProfileError: missing file, unreadable YAML, or a field that does not validate (the
            message names the file and the field).
    """
    path = landscape_path(path_or_name)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as e:
        raise ProfileError(
            f"landscape {path}: cannot read it: {e.strerror}", path=str(path)
        ) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ProfileError(
            f"landscape {path}: cannot read YAML{where}; fix the syntax", path=str(path)
        ) from None
    if not isinstance(data, dict):
        raise ProfileError(
            f"landscape {path}: the top level must be a mapping of fields", path=str(path)
        )
    try:
        return Landscape.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        loc = ".".join(str(p) for p in first["loc"]) or "(top level)"
        more = f" (and {e.error_count() - 1} more)" if e.error_count() > 1 else ""
        raise ProfileError(
            f"landscape {path}: {loc}: {first['msg']}{more}; see docs/twin.md for the format",
            path=str(path),
        ) from None
