"""Landscapes: the twin's performance model as data, and its ground truth.

A landscape (YAML, one file per stack) holds every number of the model (docs/twin.md says what
each field is and where it comes from); ``Landscape`` answers what a configuration does on it:
whether it boots, its noise-free truth per cell, one noisy measurement, its boot time. This
module owns the landscape as a whole (its sections consistent with each other, a configuration
resolved against its knob space, the truth of a configuration on a cell) and where landscapes
are found and how one is loaded. What each section's fields accept is
``cluster.twin.sections``'s; the equations are ``cluster.twin.physics``'s; a noisy measurement
is ``cluster.twin.measurement``'s; the exhaustive search for the optimum is
``cluster.twin.optimum``'s.

Imports the standard library, ``yaml``, ``pydantic``, ``knobs`` and ``cluster.prompts`` only: it
runs on every node (an import contract in pyproject.toml checks the twin's imports).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, PrivateAttr, ValidationError, model_validator

from cluster import prompts
from cluster.twin import measurement, noise, optimum
from cluster.twin.physics import (
    BootGate,
    BootStatus,
    CellTruth,
    EngineModel,
    Settings,
    window_tokens,
)
from cluster.twin.sections import (
    KNOBS,
    Acceptance,
    Boot,
    Decode,
    EngineDefaults,
    Noise,
    Prefill,
    StrictModel,
    TimeScale,
    Topology,
    Trap,
)
from knobs.catalog import catalog
from knobs.errors import KnobError, ProfileError
from knobs.records import CellResultRecord, CellSpec
from knobs.space import KnobSpace
from knobs.spec import Value

#: Where the shipped landscapes live.
LANDSCAPES_DIR = Path(__file__).resolve().parent / "landscapes"

#: The landscape a bare ``optimum`` (and a twin launcher without ``TWIN_LANDSCAPE``) uses.
DEFAULT_LANDSCAPE = "vllm-dflash2-tp4"


class Landscape(StrictModel):
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
        try:
            return Settings.resolve(
                config, self._defaults, max_model_len or self.engine_defaults.max_model_len
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
        config does not boot (``cluster.twin.measurement``).

        Raises:
            KnobError: a value of the wrong type for its knob.
        """
        return measurement.sample(self, config, cell, rng, boot_factor)

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
