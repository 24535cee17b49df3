"""Research efficiency: this loop against the usual ones, side by side, on the twin's landscapes.

Every method gets the same budget of experiments on the same simulated cluster (the twin's
performance and noise model, stuck clocks included, no processes):

- ``orchestrate``: the round loop with its default verdict policy (sequential, Bayesian,
  a one-knob change judged with its knob's effect prior where the catalog declares one,
  predictive futility, confirmation boots, greedy-output and clock checks, the champion
  re-measured until it has three boots and booted while undecided when it has fewer boots
  than the candidate, a boot with a node's clocks off set aside and taken again, drift
  sentinel) and the Optuna one-knob proposer, which gives the knobs known to matter (K, CUDA
  graphs) a first look under each champion, K's in the order the draft-length model predicts
  from the champion's per-position acceptance;
- ``orchestrate-prev``: the loop of the previous benchmark: K's first looks in TPE's order,
  every value (no draft-length model);
- ``orchestrate-pointwise``: the same as ``orchestrate``, but a boot failure bars only the
  value that failed (no monotone failures: an out-of-memory crash at one memory fraction does
  not bar the larger ones), as the loop worked before knob specs declared them;
- ``greedy-2%``: the same loop and proposer, deciding on a single run with a 2% threshold,
  no output or clock check and no re-measurement of the champion (the common practice);
- ``optuna-tpe``: Optuna TPE over the full space, one run per trial, best measured trial wins;
- ``grid``: a coarse grid in random order, one run per point, best measured point wins.

Ground truth (noise-free objective, validity) comes from the landscape. After the table, the
ceilings: what any one-knob loop that keeps only true gains can reach on each landscape, and
what the smallest step on the way to 99% of the optimum costs in boots. Run:

    .venv/bin/python bench/research.py --seeds 30 --budget 40
"""

from __future__ import annotations

import argparse
import heapq
import io
import itertools
import json
import math
import random
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from pydantic import ValidationError
from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agents import OptunaProposer
from agents.optuna_proposer import distributions
from cluster.simulated import SimulatedTestbed
from cluster.twin.landscape import Landscape, load_landscape
from knobs.catalog import catalog
from knobs.config import Config
from ledger import Ledger
from orchestrator.approval import ApprovalGate
from orchestrator.display import RoundDisplay
from orchestrator.profile import Profile, VerdictSpec
from orchestrator.round import RoundOptions, RoundRunner
from orchestrator.testbed import NullSink
from orchestrator.verdict import objective

LANDSCAPES = ("vllm-dflash2-tp4", "sm121-2node", "exl3-tp4")
METHODS = (
    "orchestrate",
    "orchestrate-prev",
    "orchestrate-pointwise",
    "greedy-2%",
    "optuna-tpe",
    "grid",
)
#: The proposer of the previous benchmark (commit ``d452fc4``): the draft length's first looks
#: in TPE's order, every value, no draft-length model. Its verdict policy is today's.
PREVIOUS_PROPOSER = {"draft_model": False}


@dataclass
class Trace:
    """What one method did on one landscape with one seed."""

    method: str
    champions: list[dict[str, Any]] = field(default_factory=list)  # after each experiment
    boots: list[int] = field(default_factory=list)  # cumulative, after each experiment
    keeps: int = 0
    wrong_keeps: int = 0
    wrong_discards: int = 0
    invalid_promoted: int = 0
    decided: int = 0
    boot_failures: int = 0  # experiments whose config did not boot
    remeasures: int = 0  # boots of the champion after its first measurement
    stuck_boots: int = 0  # boots with a node's clocks stuck


def truth(landscape: Landscape, config: dict[str, Any]) -> float:
    """The noise-free objective of a config; 0 if it does not boot or is invalid."""
    value = landscape.objective(config)
    if value is None:
        return 0.0
    if any(landscape.truth(config, c).invalid for c in landscape.cells()):
        return 0.0
    return value


def profile_for(
    landscape: Landscape, policy: dict[str, Any], *, monotone: bool = True, clocks: bool = True
) -> Profile:
    """A minimal profile around a landscape: its knob catalog and reference cells.

    ``monotone=False`` drops the catalog's monotone failures, so that a boot failure bars only
    the value that failed (how the loop worked before they existed). ``clocks=False`` reads no
    node's clocks: a boot with a node stuck counts like any other (the common practice).
    """
    knobs: dict[str, Any] = {"knob_catalog": landscape.catalog}
    if not monotone:
        knobs = {
            "knobs": [
                k.model_copy(update={"monotone_failures": {}}).model_dump()
                for k in catalog(landscape.catalog)
            ]
        }
    return Profile.model_validate(
        {
            "name": f"sim-{landscape.name}",
            "model": "sim",
            "cluster": {
                "name": f"sim-{landscape.name}",
                "nodes": [{"rank": 0, "host": "127.0.0.1", "workdir": "/nonexistent"}],
            },
            "launcher": {"argv": ["true"]},
            **knobs,
            "cells": [c.model_dump() for c in landscape.cells()],
            **({} if clocks else {"gates": {"min_matmul_rate": 0.01}}),
            # the profile expects the noise the cluster has (what a user's profile would say)
            "verdict": {
                "noise": {
                    "boot_to_boot": landscape.noise.boot_to_boot,
                    "run_to_run": landscape.noise.run_to_run,
                },
                **policy,
            },
        }
    )


def run_loop(
    landscape: Landscape,
    seed: int,
    budget: int,
    policy: dict[str, Any],
    name: str,
    *,
    monotone: bool = True,
    clocks: bool = True,
    first_looks: bool = True,
    draft_model: bool = True,
) -> Trace:
    """The real round loop on a simulated cluster, in a throwaway SQLite ledger."""
    profile = profile_for(landscape, policy, monotone=monotone, clocks=clocks)
    trace = Trace(name)
    with tempfile.TemporaryDirectory() as tmp, Ledger(f"sqlite:///{tmp}/ledger.db") as ledger:
        testbed = SimulatedTestbed(landscape, seed)
        runner = RoundRunner(
            profile,
            ledger,
            NullSink(),
            testbed,
            OptunaProposer(seed=seed, first_looks=first_looks, draft_model=draft_model),
            ApprovalGate(ledger, "auto"),
            RoundDisplay(Console(file=io.StringIO())),
        )
        runner.run(RoundOptions(budget=budget, proposer="optuna", approve="auto", seed=seed))
        experiments = ledger.experiments()
        boots_by_time = sorted(
            (b.started_at, b.id) for e in experiments for b in ledger.boots(e.id)
        )
        champion = experiments[0].config
        for e in experiments[1:]:
            if e.status is None:
                continue
            before = truth(landscape, champion.as_dict())
            mine = truth(landscape, e.config.as_dict())
            trace.decided += 1
            trace.boot_failures += e.status == "crash"
            if e.status == "keep":
                trace.keeps += 1
                trace.wrong_keeps += mine <= before
                if any(landscape.truth(e.config.as_dict(), c).invalid for c in landscape.cells()):
                    trace.invalid_promoted += 1
                champion = e.config
            elif e.status in ("discard", "inconclusive") and before > 0 and mine >= 1.05 * before:
                trace.wrong_discards += 1
            trace.champions.append(champion.as_dict())
            assert e.decided_at is not None
            trace.boots.append(sum(1 for started, _ in boots_by_time if started <= e.decided_at))
        trace.stuck_boots = testbed.stuck_boots
        last = max((e.decided_at for e in experiments if e.decided_at is not None), default=None)
        trace.remeasures = sum(
            1
            for e in experiments
            for b in ledger.boots(e.id)
            if b.role == "remeasure" and last is not None and b.started_at <= last
        )
    return trace


def measure(
    landscape: Landscape, config: dict[str, Any], testbed: SimulatedTestbed
) -> float | None:
    """One boot and one run of every cell; None if it does not boot."""
    try:
        testbed.deploy(Config(config))
    except Exception:
        return None
    return objective([testbed.bench(c) for c in landscape.cells()])


def run_best_of(landscape: Landscape, seed: int, budget: int, configs: Any, name: str) -> Trace:
    """A method that measures configs once each and keeps the best measured one."""
    trace = Trace(name)
    testbed = SimulatedTestbed(landscape, seed)
    default = landscape.knob_space().default_config().as_dict()
    best_config, best_value = default, measure(landscape, default, testbed) or 0.0
    # the method hears each measurement (``send``): TPE learns from the one that counts
    proposals = configs(best_config)
    value: float | None = None
    for i in range(budget):
        config = next(proposals) if i == 0 else proposals.send(value)
        value = measure(landscape, config, testbed)
        trace.decided += 1
        trace.boot_failures += value is None
        before = truth(landscape, best_config)
        mine = truth(landscape, config)
        if value is not None and value > best_value:
            trace.keeps += 1
            trace.wrong_keeps += mine <= before
            if any(landscape.truth(config, c).invalid for c in landscape.cells()):
                trace.invalid_promoted += 1
            best_config, best_value = config, value
        elif before > 0 and mine >= 1.05 * before:
            trace.wrong_discards += 1
        trace.champions.append(best_config)
        trace.boots.append(testbed.boots)
    trace.stuck_boots = testbed.stuck_boots
    return trace


def tpe_configs(landscape: Landscape, seed: int) -> Any:
    space = landscape.knob_space()
    dists = distributions(space)
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=seed))

    def generate(_start: dict[str, Any]) -> Any:
        while True:
            trial = study.ask(dists)
            value = yield dict(trial.params)  # the measurement run_best_of made
            if value is None:
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
            else:
                study.tell(trial, value)

    return generate


def grid_configs(landscape: Landscape, seed: int) -> Any:
    space = landscape.knob_space()
    levels = []
    for spec in space.knobs:
        domain = spec.domain()
        if len(domain) > 4:
            picks = sorted({0, len(domain) // 3, (2 * len(domain)) // 3, len(domain) - 1})
            domain = [domain[i] for i in picks] + [spec.default]
        levels.append(sorted(set(domain), key=str))
    grid = [dict(zip(space.names, values, strict=True)) for values in itertools.product(*levels)]
    random.Random(seed).shuffle(grid)

    def generate(_start: dict[str, Any]) -> Any:
        # not ``yield from grid``: run_best_of sends each measurement, and a list iterator
        # cannot take send()
        for config in grid:  # noqa: UP028
            yield config

    return generate


def summarise(landscape: Landscape, trace: Trace, optimum: float) -> dict[str, Any]:
    reach = next(
        (i + 1 for i, c in enumerate(trace.champions) if truth(landscape, c) >= 0.99 * optimum),
        None,
    )
    final = truth(landscape, trace.champions[-1]) / optimum if trace.champions else 0.0
    return {
        "experiments_to_99": reach,
        "boots_to_99": None if reach is None else trace.boots[reach - 1],
        "final_pct": 100 * final,
        "wrong_keeps": trace.wrong_keeps,
        "wrong_discards_ge5": trace.wrong_discards,
        "invalid_promoted": trace.invalid_promoted,
        "decided": trace.decided,
        "boot_failures": trace.boot_failures,
        "remeasures": trace.remeasures,
        "stuck_boots": trace.stuck_boots,
        "boots": trace.boots[-1] if trace.boots else 0,
    }


def ceiling(landscape: Landscape, margin_pct: float) -> float:
    """The best true objective a one-knob hill climb can reach from the default config when
    every step it keeps is a true gain of at least ``margin_pct``: a loop that keeps only real
    gains can do no better. Exhaustive over improving chains, memoised on the config."""
    space = landscape.knob_space()
    best: dict[str, float] = {}

    def climb(config: Config) -> float:
        if config.key not in best:
            here = truth(landscape, config.as_dict())
            top = here
            for change in space.neighbours(config):
                nxt = config.apply(change)
                if here > 0 and truth(landscape, nxt.as_dict()) >= here * (1 + margin_pct / 100):
                    top = max(top, climb(nxt))
            best[config.key] = top
        return best[config.key]

    return climb(space.default_config())


def widest_path(
    landscape: Landscape, target: float, limit: int = 5000
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
        for change in space.neighbours(config):
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
    """What the landscapes allow an honest one-knob loop, and what the last steps cost."""
    print("\n## What a one-knob loop can reach\n")
    print(
        "ceiling: the best true objective (% of the optimum) reachable from the default config "
        "by one-knob steps that are each a true gain of at least 0.1% / 2% (the equivalence "
        "margin). Path to 99%: the one-knob path to 99% of the optimum whose smallest step is "
        "largest (no step a true loss), and the boots per side a one-sided 95% test needs to "
        "tell that smallest step from nothing at the landscape's boot-to-boot noise.\n"
    )
    print(
        "| landscape | ceiling, steps ≥ 0.1% | ceiling, steps ≥ 2% | path to 99% "
        "| smallest step | boots/side |"
    )
    print("|---|---|---|---|---|---|")
    for name in names:
        landscape = landscape_for(name, boot_noise)
        optimum = float(landscape.optimum()["objective"])
        tops = [100 * ceiling(landscape, m) / optimum for m in (0.1, 2.0)]
        path = widest_path(landscape, 0.99 * optimum)
        if path is None:
            steps, smallest = "not found", math.nan
        else:
            steps = ", ".join(f"{what} ({gain:+.1f}%)" for what, gain in path)
            smallest = min((gain for _, gain in path), default=math.nan)
        need = boots_to_tell(smallest, landscape.boot_to_boot)
        print(
            f"| {name} | {tops[0]:.1f}% | {tops[1]:.1f}% | {steps} | {smallest:+.1f}% | "
            f"{need:.0f} |"
        )


def verdict_settings(text: str) -> dict[str, Any]:
    """``--policy``: a JSON object of ``VerdictSpec`` fields, checked before any run starts."""
    try:
        settings = json.loads(text)
        VerdictSpec.model_validate(settings)
    except ValidationError as e:
        error = e.errors()[0]
        where = ".".join(map(str, error["loc"])) or "the value"
        why = f"{where}: {error['msg']}"
    except ValueError as e:
        why = str(e)
    else:
        assert isinstance(settings, dict)
        return settings
    raise argparse.ArgumentTypeError(
        f"{text!r} is not a JSON object of verdict settings ({why}); e.g. '{{\"max_boots\": 6}}'"
    )


def noise_level(text: str) -> float:
    """``--boot-noise``: a relative standard deviation in [0, 1]."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a relative sd in [0, 1], e.g. 0.02")
    return value


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument(
        "--first-seed", type=int, default=0, help="seeds first-seed … first-seed + seeds - 1"
    )
    parser.add_argument("--budget", type=int, default=40)
    parser.add_argument("--landscapes", nargs="*", default=list(LANDSCAPES))
    parser.add_argument("--methods", nargs="*", default=list(METHODS))
    parser.add_argument("--json", type=Path, help="also write every run's summary here")
    parser.add_argument(
        "--policy",
        type=verdict_settings,
        default={},
        help="verdict settings for orchestrate, over its profile's: '{\"max_boots\": 6}'",
    )
    parser.add_argument(
        "--no-first-looks",
        action="store_true",
        help="orchestrate's proposer without first looks (TPE's preferences alone)",
    )
    parser.add_argument(
        "--no-draft-model",
        action="store_true",
        help="orchestrate's proposer without the draft-length model (K's looks in TPE's order)",
    )
    parser.add_argument(
        "--boot-noise",
        type=noise_level,
        help="replace every landscape's boot-to-boot noise (relative sd, default: theirs, 0.05)",
    )
    parser.add_argument(
        "--ceilings-only", action="store_true", help="print only what a one-knob loop can reach"
    )
    args = parser.parse_args()
    if args.ceilings_only:
        report_ceilings(args.landscapes, args.boot_noise)
        return 0
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    rows: list[dict[str, Any]] = []
    started = time.monotonic()
    for name in args.landscapes:
        landscape = landscape_for(name, args.boot_noise)
        optimum = float(landscape.optimum()["objective"])
        for method in args.methods:
            for seed in range(args.first_seed, args.first_seed + args.seeds):
                if method == "orchestrate":
                    trace = run_loop(
                        landscape,
                        seed,
                        args.budget,
                        args.policy,
                        method,
                        first_looks=not args.no_first_looks,
                        draft_model=not args.no_draft_model,
                    )
                elif method == "orchestrate-prev":
                    trace = run_loop(landscape, seed, args.budget, {}, method, **PREVIOUS_PROPOSER)
                elif method == "orchestrate-pointwise":
                    trace = run_loop(landscape, seed, args.budget, {}, method, monotone=False)
                elif method == "greedy-2%":
                    policy = {
                        "policy": "threshold",
                        "threshold_pct": 2.0,
                        "check_greedy": False,
                        "champion_boots": 1,  # the common practice never re-measures
                        "drift_every": 10 * args.budget,
                    }
                    trace = run_loop(landscape, seed, args.budget, policy, method, clocks=False)
                elif method == "optuna-tpe":
                    trace = run_best_of(
                        landscape, seed, args.budget, tpe_configs(landscape, seed), method
                    )
                else:
                    trace = run_best_of(
                        landscape, seed, args.budget, grid_configs(landscape, seed), method
                    )
                rows.append(
                    {
                        "landscape": name,
                        "method": method,
                        "seed": seed,
                        **summarise(landscape, trace, optimum),
                    }
                )
            print(
                f"  {name} {method}: {args.seeds} seeds done ({time.monotonic() - started:.0f}s)",
                file=sys.stderr,
            )
    report(rows, args)
    report_ceilings(args.landscapes, args.boot_noise)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


COLUMNS = (
    "landscape",
    "method",
    "reached 99%",
    "experiments to 99%",
    "boots to 99%",
    "final % of optimum",
    "wrong keeps (% of decided)",
    "wrong discards ≥5%",
    "invalid promoted",
    "boots/decided",
    "boot failures/run",
    "champion re-measures/run",
    "stuck-clock boots/run",
)


def report(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    """Print the table and the ratios as Markdown."""
    noise = "" if args.boot_noise is None else f", boot-to-boot noise {args.boot_noise:g}"
    if args.policy:
        noise += f", orchestrate's verdict settings {json.dumps(args.policy)}"
    print(
        f"# research efficiency: {args.seeds} seeds, budget {args.budget} experiments a run"
        f"{noise}\n"
    )
    print("| " + " | ".join(COLUMNS) + " |")
    print("|" + "---|" * len(COLUMNS))
    summary: dict[tuple[str, str], dict[str, float]] = {}
    for name in args.landscapes:
        for method in args.methods:
            mine = [r for r in rows if r["landscape"] == name and r["method"] == method]
            reached = [r for r in mine if r["experiments_to_99"] is not None]
            # a run that never reached 99% counts as budget + 1 experiments
            exp = _mean([r["experiments_to_99"] or args.budget + 1 for r in mine])
            boots = _mean([r["boots_to_99"] or r["boots"] + 1 for r in mine])
            decided = sum(r["decided"] for r in mine)
            wrong = sum(r["wrong_keeps"] for r in mine)
            final = _mean([r["final_pct"] for r in mine])
            summary[(name, method)] = {"exp": exp, "final": final}
            cells = [
                name,
                method,
                f"{len(reached)}/{len(mine)}",
                f"{exp:.1f}",
                f"{boots:.1f}",
                f"{final:.1f}",
                f"{wrong} ({100 * wrong / max(1, decided):.1f}%)",
                str(sum(r["wrong_discards_ge5"] for r in mine)),
                str(sum(r["invalid_promoted"] for r in mine)),
                f"{sum(r['boots'] for r in mine) / max(1, decided):.2f}",
                f"{_mean([r['boot_failures'] for r in mine]):.1f}",
                f"{_mean([r['remeasures'] for r in mine]):.1f}",
                f"{_mean([r['stuck_boots'] for r in mine]):.1f}",
            ]
            print("| " + " | ".join(cells) + " |")
    if "orchestrate" not in args.methods:
        return
    print("\n## orchestrate / baseline\n")
    print("experiments to 99% (a run that never got there counts budget + 1; lower is better),")
    print("final champion's true objective (higher is better)\n")
    for name in args.landscapes:
        ours = summary[(name, "orchestrate")]
        for method in args.methods:
            if method == "orchestrate":
                continue
            theirs = summary[(name, method)]
            ratio = "n/a" if theirs["final"] == 0 else f"×{ours['final'] / theirs['final']:.3f}"
            print(
                f"- {name} vs {method}: experiments to 99% ×{ours['exp'] / theirs['exp']:.2f}, "
                f"final {ours['final']:.1f}% vs {theirs['final']:.1f}% ({ratio})"
            )


if __name__ == "__main__":
    raise SystemExit(main())
