"""Landscapes: the twin's performance model as data, and its ground truth.

A landscape (YAML, one file per stack) holds every number of the model (docs/twin.md says what
each field is and where it comes from); ``Landscape`` answers what a configuration does on it:
whether it boots, its noise-free truth per cell, one noisy measurement, its boot time. The
equations are ``cluster.twin.physics``'s; the exhaustive search for the optimum is
``cluster.twin.optimum``'s.

Imports the standard library, ``yaml``, ``pydantic``, ``knobs`` and ``cluster.prompts`` only: it
runs on every node (an import contract in pyproject.toml checks the twin's imports).
"""

from __future__ import annotations

import dataclasses
import itertools
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from cluster import prompts
from cluster.twin import noise, optimum, text
from cluster.twin.physics import (
    BootGate,
    BootStatus,
    CellTruth,
    EngineModel,
    Settings,
    window_tokens,
)
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
        return self.performance(settings, self.cells() if cells is None else cells)

    def performance(self, settings: Settings, cells: Sequence[CellSpec]) -> float:
        """Sum of noise-free output tok/s of ``settings`` over ``cells``, as if it booted."""
        return sum(self._perf(settings, cell).output_tok_s for cell in cells)

    def optimum(self, cells: Sequence[CellSpec] | None = None) -> dict[str, Any]:
        """The best valid configuration of the knob space, per cell and in total.

        Ties (knobs with no served effect, e.g. the adapter rank) go to the configuration with
        the fewest knobs away from the knob space's defaults, then to the earliest in domain
        order. Also reports the default config, the fastest invalid config (the trap) and counts
        (``cluster.twin.optimum``).

        Raises:
            ProfileError: no configuration of the knob space boots.
        """
        return optimum.report(self, cells)

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
