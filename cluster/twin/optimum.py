"""A landscape's optimum: every configuration of its knob space scored noise-free.

``Landscape.optimum`` reports it (``python -m cluster.twin optimum``, the benchmark's % of the
optimum). Ties (knobs with no served effect, e.g. the adapter rank) go to the configuration with
the fewest knobs away from the knob space's defaults, then to the earliest in domain order.

Imports the standard library and ``knobs`` only: it runs on every node.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cluster.twin.physics import BootStatus, Settings
from knobs.errors import ProfileError
from knobs.records import CellSpec
from knobs.space import KnobSpace
from knobs.spec import Value

if TYPE_CHECKING:
    from cluster.twin.landscape import Landscape

#: The memory knob: it decides whether a configuration boots, never how fast it serves.
MEMORY = "gpu_memory_utilization"


def report(landscape: Landscape, cells: Sequence[CellSpec] | None = None) -> dict[str, Any]:
    """The best valid configuration of the knob space, per cell and in total.

    Also reports the default config, the fastest invalid config (the trap) and counts.

    Raises:
        ProfileError: no configuration of the knob space boots.
    """
    chosen = landscape.cells() if cells is None else list(cells)
    space = landscape.knob_space()
    names = space.names
    default = space.default_config()
    search = _search(landscape, space, chosen)
    best, trap_best = search.best, search.trap_best
    if best is None:
        raise ProfileError(f"landscape {landscape.name}: no configuration of the knob space boots")
    out: dict[str, Any] = {
        "landscape": landscape.name,
        "time_scale": landscape.time_scale.model_dump(),
        "config": {n: best[2][n] for n in names},
        "objective": best[0],
        "cells": _cell_report(landscape, best[2], chosen),
        "ties": search.ties,
        "default": {
            "config": default.as_dict(),
            "objective": landscape.objective(default, chosen),
        },
        "counts": search.counts,
    }
    if trap_best is not None:
        out["fastest_invalid"] = {
            "config": {n: trap_best[2][n] for n in names},
            "objective": trap_best[0],
            "reason": next(t.reason for t in landscape.traps if t.matches(trap_best[2])),
        }
    return out


def _search(landscape: Landscape, space: KnobSpace, cells: Sequence[CellSpec]) -> _Search:
    """Every configuration of ``space`` scored on ``cells``, noise-free.

    The memory knob changes whether a config boots, never how fast it serves: each
    combination of the other knobs is scored once, then tried at every memory level.
    """
    default = space.default_config()
    others = [k for k in space.knobs if k.name != MEMORY]
    levels: list[Value | None] = (
        list(space.spec(MEMORY).domain()) if MEMORY in space.names else [None]
    )
    search = _Search()
    for values in itertools.product(*(k.domain() for k in others)):
        partial = dict(zip((k.name for k in others), values, strict=True))
        first = landscape.settings(
            {**partial, **({MEMORY: levels[0]} if levels[0] is not None else {})}
        )
        total = landscape.performance(first, cells)
        trapped = landscape.trap_for(first) is not None
        moved_partial = sum(1 for n, v in partial.items() if v != default[n])
        for level, status in zip(levels, _boot_statuses(landscape, first, levels), strict=True):
            config: dict[str, Value] = dict(partial)
            if level is not None:
                config[MEMORY] = level
            moved = moved_partial + (1 if level is not None and level != default[MEMORY] else 0)
            search.add(status, total, moved, config, trapped=trapped)
    return search


def _boot_statuses(
    landscape: Landscape, first: Settings, levels: Sequence[Value | None]
) -> list[BootStatus]:
    """``boot_status`` of ``first`` at each memory level (``None``: ``first``'s own level)."""
    if MEMORY not in landscape.boot.requires:
        # the level decides only oom and KV capacity: one gate serves every level
        gate = landscape.boot_gate(first)
        return [
            gate.status(first.gpu_memory_utilization if level is None else float(level))
            for level in levels
        ]
    return [
        landscape.boot_status(
            first
            if level is None
            else dataclasses.replace(first, gpu_memory_utilization=float(level))
        )[0]
        for level in levels
    ]


def _cell_report(
    landscape: Landscape, config: Mapping[str, object], cells: Sequence[CellSpec]
) -> list[dict[str, Any]]:
    rows = []
    for cell in cells:
        t = landscape.truth(config, cell)
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


@dataclass
class _Search:
    """The tally: the best valid and the best invalid config, counts and ties."""

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
