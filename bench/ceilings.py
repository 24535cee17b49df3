"""What a one-knob loop can reach on a landscape: the ground truth of a config, the moves the
loop may make from it, the best objective a hill climb of true gains reaches (``ceiling``), the
path to a target whose smallest step is largest (``widest_path``) and the boots a one-sided
test needs to tell that step from nothing. ``bench/research.py`` prints them after its tables
(``--ceilings-only``: alone).
"""

from __future__ import annotations

import heapq
import itertools
import math
from typing import Any

from cluster.twin.landscape import Landscape, load_landscape
from knobs.config import Change, Config
from knobs.errors import KnobError


def truth(landscape: Landscape, config: dict[str, Any]) -> float:
    """The noise-free objective of a config; 0 if it does not boot or is invalid."""
    value = landscape.objective(config)
    if value is None:
        return 0.0
    if any(landscape.truth(config, c).invalid for c in landscape.cells()):
        return 0.0
    return value


def steps(landscape: Landscape, config: Config, coupled: bool) -> list[Change]:
    """The moves the loop may make from ``config``: every one-knob neighbour and, with
    ``coupled``, the coupled moves (``agents.coupled``): a neighbour that does not boot for a
    failure class another knob declares monotone, with that knob's next value in the
    direction that cures it (one try, as the loop makes)."""
    space = landscape.knob_space()
    out = space.neighbours(config)
    if not coupled:
        return out
    for change in list(out):
        status, _ = landscape.boot_status(landscape.settings(config.apply(change).as_dict()))
        if status not in ("oom", "kv_capacity"):
            continue
        for spec in space.knobs:
            side = spec.monotone_failures.get(status)
            held = config[spec.name]
            if side is None or spec.name == change.knob or isinstance(held, bool | str):
                continue
            cure = [v for v in spec.domain() if isinstance(v, int | float) and v > held]
            if side == "above":
                cure = sorted(
                    (v for v in spec.domain() if isinstance(v, int | float) and v < held),
                    reverse=True,
                )
            if not cure:
                continue
            try:
                out.append(
                    space.coupled_change(config, change.knob, change.new, spec.name, cure[0])
                )
            except KnobError:
                continue
    return out


def ceiling(landscape: Landscape, margin_pct: float, coupled: bool = False) -> float:
    """The best true objective a one-knob hill climb can reach from the default config when
    every step it keeps is a true gain of at least ``margin_pct``: a loop that keeps only real
    gains can do no better. Exhaustive over improving chains, memoised on the config.
    ``coupled``: coupled moves are steps too (``steps``)."""
    best: dict[str, float] = {}

    def climb(config: Config) -> float:
        if config.key not in best:
            here = truth(landscape, config.as_dict())
            top = here
            for change in steps(landscape, config, coupled):
                nxt = config.apply(change)
                if here > 0 and truth(landscape, nxt.as_dict()) >= here * (1 + margin_pct / 100):
                    top = max(top, climb(nxt))
            best[config.key] = top
        return best[config.key]

    return climb(landscape.knob_space().default_config())


def widest_path(
    landscape: Landscape, target: float, limit: int = 5000, coupled: bool = False
) -> list[tuple[str, float]] | None:
    """The one-knob path from the default config to a config whose true objective is at least
    ``target`` whose smallest step is as large as possible (steps never lose: a kept loss is a
    wrong keep), as ``(change, true gain %)``; ``None`` if none is found within ``limit``
    expanded configs. Best-first on (smallest step so far, fewest steps, objective)."""
    space = landscape.knob_space()
    start = space.default_config()
    queue: list[tuple[float, int, float, int, Config, list[tuple[str, float]]]] = []
    counter = itertools.count()
    heapq.heappush(queue, (-math.inf, 0, -truth(landscape, start.as_dict()), 0, start, []))
    seen: set[str] = set()
    while queue and len(seen) < limit:
        neg_width, _, neg_value, _, config, path = heapq.heappop(queue)
        if config.key in seen:
            continue
        seen.add(config.key)
        here = -neg_value
        if here >= target:
            return path
        for change in steps(landscape, config, coupled):
            nxt = config.apply(change)
            value = truth(landscape, nxt.as_dict())
            if here <= 0 or value < here or nxt.key in seen:
                continue
            gain = 100 * (value / here - 1)
            width = min(-neg_width, gain)
            step = (change.describe(), gain)
            heapq.heappush(
                queue, (-width, len(path) + 1, -value, next(counter), nxt, [*path, step])
            )
    return None


def boots_to_tell(gain_pct: float, boot_cv: float, z: float = 1.645) -> float:
    """Boots per side for a one-sided test at ``z`` to tell a true ``gain_pct`` from nothing
    with even odds, when each boot's objective scatters ``boot_cv`` (relative sd)."""
    if gain_pct <= 0:
        return math.inf
    return 2 * (z * boot_cv / math.log1p(gain_pct / 100)) ** 2


def landscape_for(name: str, boot_noise: float | None) -> Landscape:
    """A shipped landscape, with its boot-to-boot noise replaced when ``boot_noise`` is set."""
    landscape = load_landscape(name)
    if boot_noise is None:
        return landscape
    noise = landscape.noise.model_copy(update={"boot_to_boot": boot_noise})
    return landscape.model_copy(update={"noise": noise})


def report_ceilings(names: list[str], boot_noise: float | None = None) -> None:
    """What the landscapes allow an honest one-knob loop, and what the last steps cost; then
    the same with coupled moves as steps (where they change anything)."""
    print("\n## What a one-knob loop can reach\n")
    print(
        "ceiling: the best true objective (% of the optimum) reachable from the default config "
        "by one-knob steps that are each a true gain of at least 0.1% / 2% (the equivalence "
        "margin). Path to 99%: the one-knob path to 99% of the optimum whose smallest step is "
        "largest (no step a true loss), and the boots per side a one-sided 95% test needs to "
        "tell that smallest step from nothing at the landscape's boot-to-boot noise.\n"
    )
    header = (
        "| landscape | ceiling, steps ≥ 0.1% | ceiling, steps ≥ 2% | path to 99% "
        "| smallest step | boots/side |\n|---|---|---|---|---|---|"
    )
    print(header)
    rows = {name: _ceiling_row(name, boot_noise, coupled=False) for name in names}
    for row in rows.values():
        print(row)
    with_coupled = {name: _ceiling_row(name, boot_noise, coupled=True) for name in names}
    changed = [row for name, row in with_coupled.items() if row != rows[name]]
    print("\n### With coupled moves\n")
    print(
        "The same, where a step may also be a coupled move (a value that does not boot for a "
        "failure another knob declares monotone, with that knob's next value); landscapes "
        "where it changes nothing are left out.\n"
    )
    if changed:
        print(header)
        for row in changed:
            print(row)
    else:
        print("(it changes nothing on these landscapes)")


def _ceiling_row(name: str, boot_noise: float | None, *, coupled: bool) -> str:
    landscape = landscape_for(name, boot_noise)
    optimum = float(landscape.optimum()["objective"])
    tops = [100 * ceiling(landscape, m, coupled) / optimum for m in (0.1, 2.0)]
    path = widest_path(landscape, 0.99 * optimum, coupled=coupled)
    if path is None:
        shown, smallest = "not found", math.nan
    else:
        shown = ", ".join(f"{what} ({gain:+.1f}%)" for what, gain in path)
        smallest = min((gain for _, gain in path), default=math.nan)
    need = boots_to_tell(smallest, landscape.boot_to_boot)
    return f"| {name} | {tops[0]:.1f}% | {tops[1]:.1f}% | {shown} | {smallest:+.1f}% | {need:.0f} |"
