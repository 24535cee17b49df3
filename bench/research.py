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

Landscapes: the seed cards' three stacks (``LANDSCAPES``) and four unlike them
(``NEW_LANDSCAPES``, issue #18: knobs the cards call flat that matter, a best K far from the
cards', a greedy-output trap on another knob, a stack where nothing matters); ``--landscapes``
also takes YAML paths. Ground truth (noise-free objective, validity) comes from the landscape.
A table per landscape; after them, the ceilings: what any one-knob loop that keeps only true
gains can reach on each landscape, and what the smallest step on the way to 99% of the optimum
costs in boots. ``--json`` writes one row per run: the table's counts, every keep with its true
effect at the time (noise-free objective change, %, and validity), the true gains of 5% or more
tried and discarded, boots with and without the stuck-clock re-boots, and the champion's % of the
optimum after every experiment (``pct_after``; ``first_reached[p]``: the first experiment at
which it was p% or more). Run:

    .venv/bin/python bench/research.py --seeds 30 --budget 40
"""

from __future__ import annotations

import argparse
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
from bench.ceilings import landscape_for, report_ceilings, truth
from bench.tables import report
from cluster.simulated import SimulatedTestbed, StepDrift
from cluster.twin.landscape import Landscape
from knobs.catalog import catalog
from knobs.config import Config
from ledger import Ledger
from orchestrator.approval import ApprovalGate
from orchestrator.display import RoundDisplay
from orchestrator.errors import OrchestrateError
from orchestrator.faults import ClocksOff
from orchestrator.profile import Profile
from orchestrator.profile_sections import VerdictSpec
from orchestrator.round import RoundOptions, RoundRunner
from orchestrator.testbed import NullSink
from orchestrator.verdict import objective

#: The seed cards' stacks.
LANDSCAPES = ("vllm-dflash2-tp4", "sm121-2node", "exl3-tp4")
#: Landscapes unlike the seed cards (issue #18; each file's top comment says what it holds):
#: knobs the cards call flat that matter, a best K far from the cards', a trap on another
#: knob, a stack where nothing matters.
NEW_LANDSCAPES = ("flat-knobs-matter", "far-k", "trap-elsewhere", "flat")
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
    # boots set aside for a node's stuck clocks and taken again (only a loop that reads clocks)
    stuck_reboots: int = 0
    # rounds a run of clocks off stopped (``faults.ClocksOff``), each resumed by the same
    # command as a person would once the node is back
    clock_stops: int = 0
    # the drift sentinel: the champion's re-measurements it tested, those it flagged (each
    # followed by a confirmation boot), the re-bases (confirmed drifts), and the boot number
    # of each test with whether it led to a re-base (``sentinel_log``)
    sentinel_tests: int = 0
    drift_flags: int = 0
    drift_rebases: int = 0
    sentinel_events: list[tuple[int, bool]] = field(default_factory=list)
    true_gains_tried: int = 0  # decided changes whose true effect was >= +5 % then
    # every keep: experiment index, the change, its true effect then, valid or not
    keep_log: list[dict[str, Any]] = field(default_factory=list)
    start_pct: float = 0.0  # the default config's true objective, % of the optimum
    # the champion's level each verdict compared against, over its true objective (percent),
    # with the number of keeps before that verdict: a keep's own selected boots in the level
    # (the winner's curse) read as a positive bias after keeps, none before the first
    level_bias: list[tuple[float, int]] = field(default_factory=list)
    # what the round leaves: the champion's recorded level over its true objective (percent),
    # and the boots taken after the last decided experiment (a last keep's boot of its own)
    final_level_pct: float | None = None
    boots_after_last: int = 0
    # every decided experiment: its true effect then (%, None: does not boot), its status, the
    # verdict's rule, and the boots it took (measure, repeat and confirm)
    decisions: list[tuple[float | None, str, str, int]] = field(default_factory=list)


def true_effect_pct(
    landscape: Landscape, champion: dict[str, Any], config: dict[str, Any]
) -> float:
    """The noise-free objective change of ``config`` over ``champion``, in percent, validity
    aside (an invalid config has a speed; ``truth`` says it counts for nothing); nan when either
    does not boot."""
    before, mine = landscape.objective(champion), landscape.objective(config)
    if before is None or mine is None or before <= 0:
        return math.nan
    return 100 * (mine / before - 1)


def describe_change(champion: dict[str, Any], config: dict[str, Any]) -> str:
    """``knob old → new`` for every knob ``config`` moves away from ``champion``."""
    moved = [k for k in config if champion.get(k) != config[k]]
    return ", ".join(f"{k} {champion.get(k)} → {config[k]}" for k in moved)


def tally(
    trace: Trace,
    landscape: Landscape,
    champion: dict[str, Any],
    config: dict[str, Any],
    *,
    kept: bool,
    discarded: bool,
) -> None:
    """One decided experiment against the champion of its time, judged on the truth."""
    before = truth(landscape, champion)
    mine = truth(landscape, config)
    trace.decided += 1
    gain = before > 0 and mine >= 1.05 * before
    trace.true_gains_tried += gain
    if kept:
        invalid = any(landscape.truth(config, c).invalid for c in landscape.cells())
        trace.keeps += 1
        trace.wrong_keeps += mine <= before
        trace.invalid_promoted += invalid
        effect = true_effect_pct(landscape, champion, config)
        trace.keep_log.append(
            {
                "experiment": trace.decided,
                "change": describe_change(champion, config),
                "true_effect_pct": None if math.isnan(effect) else round(effect, 3),
                "valid": not invalid,
            }
        )
    elif discarded and gain:
        trace.wrong_discards += 1


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


#: Stops for clocks off one simulated round may resume from before the benchmark gives up.
MAX_CLOCK_STOPS = 3


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
    drift: StepDrift | None = None,
) -> Trace:
    """The real round loop on a simulated cluster, in a throwaway SQLite ledger (``drift``: a
    step injected into the cluster's speed; none by default, as the landscapes have none)."""
    profile = profile_for(landscape, policy, monotone=monotone, clocks=clocks)
    trace = Trace(name)
    with tempfile.TemporaryDirectory() as tmp, Ledger(f"sqlite:///{tmp}/ledger.db") as ledger:
        testbed = SimulatedTestbed(landscape, seed, drift)
        runner = RoundRunner(
            profile,
            ledger,
            NullSink(),
            testbed,
            OptunaProposer(seed=seed, first_looks=first_looks, draft_model=draft_model),
            ApprovalGate(ledger, "auto"),
            RoundDisplay(Console(file=io.StringIO())),
        )
        options = RoundOptions(budget=budget, proposer="optuna", approve="auto", seed=seed)
        while True:
            try:
                runner.run(options)
                break
            except ClocksOff:
                # chance the rule calls a stuck node (the simulated nodes draw each boot
                # afresh): the same command goes on, and the stop is counted
                trace.clock_stops += 1
                if trace.clock_stops > MAX_CLOCK_STOPS:
                    raise
        experiments = ledger.experiments()
        boots_by_time = sorted(
            (b.started_at, b.id) for e in experiments for b in ledger.boots(e.id)
        )
        champion = experiments[0].config
        for e in experiments[1:]:
            if e.status is None:
                continue
            trace.boot_failures += e.status == "crash"
            kept = e.status == "keep"
            verdict = ledger.verdict(e.id)
            level_bias(trace, landscape, verdict, champion.as_dict())
            effect = true_effect_pct(landscape, champion.as_dict(), e.config.as_dict())
            took = sum(  # its own boots until decided (a champion's later boots are not)
                1
                for b in ledger.boots(e.id)
                if b.role in ("measure", "repeat", "confirm")
                and e.decided_at is not None
                and b.started_at <= e.decided_at
            )
            trace.decisions.append(
                (
                    None if math.isnan(effect) else round(effect, 3),
                    str(e.status),
                    verdict.rule if verdict is not None else "",
                    took,
                )
            )
            tally(
                trace,
                landscape,
                champion.as_dict(),
                e.config.as_dict(),
                kept=kept,
                discarded=e.status in ("discard", "inconclusive"),
            )
            if kept:
                champion = e.config
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
        if clocks and last is not None:
            trace.stuck_reboots = slow_boots(ledger, experiments, last)
        if last is not None:
            sentinel_log(trace, ledger, experiments, last)
            trace.boots_after_last = sum(1 for started, _ in boots_by_time if started > last)
        final = ledger.champion(profile.cluster.name)
        true = None if final is None else landscape.objective(final.config.as_dict())
        if final is not None and true:
            trace.final_level_pct = round(100 * (final.objective / true - 1), 3)
    return trace


def level_bias(trace: Trace, landscape: Landscape, verdict: Any, champion: dict[str, Any]) -> None:
    """The champion's level a verdict compared against, over the champion's true objective."""
    level = None if verdict is None else verdict.stats.get("champion_objective")
    true = landscape.objective(champion)
    if isinstance(level, int | float) and true:
        trace.level_bias.append((round(100 * (level / true - 1), 3), trace.keeps))


def sentinel_log(trace: Trace, ledger: Ledger, experiments: list[Any], last: Any) -> None:
    """The drift sentinel's record up to ``last``: each champion re-measurement it tested (a
    drift row on a ``remeasure`` boot) by boot number (the testbed's count, from 1), and
    whether a re-base (a significant drift row) followed it; the flags (a ``confirm`` boot of
    the champion after a ``remeasure`` one: the loop since #18 confirms a flag with one more
    boot; before it every flag was a re-base)."""
    boots = sorted(
        (b for e in experiments for b in ledger.boots(e.id) if b.started_at <= last),
        key=lambda b: b.id,
    )
    number = {b.id: i for i, b in enumerate(boots, start=1)}
    by_measurement = {(b.experiment_id, b.measurement): b for b in boots}
    confirms = 0
    for e in experiments:
        roles = [b.role for b in ledger.boots(e.id) if b.started_at <= last]
        confirms += sum(
            1 for i, r in enumerate(roles) if r == "confirm" and "remeasure" in roles[:i]
        )
    events: list[tuple[int, bool]] = []
    tested: set[tuple[int, int]] = set()
    for d in ledger.drifts(ledger.experiment(experiments[0].id).cluster):
        boot = by_measurement.get((d.experiment_id, d.measurement))
        if boot is None:
            continue
        if d.significant and events:
            events[-1] = (events[-1][0], True)
        elif boot.role == "remeasure" and (d.experiment_id, d.measurement) not in tested:
            tested.add((d.experiment_id, d.measurement))
            events.append((number[boot.id], False))
    trace.sentinel_events = events
    trace.sentinel_tests = len(events)
    trace.drift_rebases = sum(1 for _, rebased in events if rebased)
    # before #18 a flag was a re-base, without a confirmation boot
    trace.drift_flags = confirms or trace.drift_rebases


def slow_boots(ledger: Ledger, experiments: list[Any], last: Any) -> int:
    """Boots up to ``last`` whose cells read a node's clocks below nominal: the loop sets each
    aside and boots the config once more, so each is one re-boot a healthy cluster would not
    need."""
    started = {b.id: b.started_at for e in experiments for b in ledger.boots(e.id)}
    slow = {
        boot_id
        for e in experiments
        for boot_id, _, cell, _ in ledger.cell_results(e.id)
        if any(c.matmul_rate < 1.0 for c in cell.clocks) and started[boot_id] <= last
    }
    return len(slow)


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
        trace.boot_failures += value is None
        kept = value is not None and value > best_value
        tally(trace, landscape, best_config, config, kept=kept, discarded=not kept)
        if kept:
            assert value is not None
            best_config, best_value = config, value
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
    """One run's row: the table's numbers and, for checks made from the JSON, the keeps' true
    effects and the champion's % of the optimum after every experiment."""
    default = landscape.knob_space().default_config().as_dict()
    pct = [100 * truth(landscape, c) / optimum for c in [default, *trace.champions]]
    reach = next((i for i, p in enumerate(pct) if i > 0 and p >= 99.0), None)
    boots = trace.boots[-1] if trace.boots else 0
    return {
        "experiments_to_99": reach,
        "boots_to_99": None if reach is None else trace.boots[reach - 1],
        "final_pct": pct[-1],
        "start_pct": pct[0],
        "keeps": trace.keeps,
        "keep_effects": trace.keep_log,
        "keeps_under_1pct": sum(
            1
            for k in trace.keep_log
            if not k["valid"] or k["true_effect_pct"] is None or k["true_effect_pct"] < 1.0
        ),
        "wrong_keeps": trace.wrong_keeps,
        "wrong_discards_ge5": trace.wrong_discards,
        "true_gains_ge5_tried": trace.true_gains_tried,
        "invalid_promoted": trace.invalid_promoted,
        "decided": trace.decided,
        "boot_failures": trace.boot_failures,
        "remeasures": trace.remeasures,
        "stuck_boots": trace.stuck_boots,
        "stuck_reboots": trace.stuck_reboots,
        "clock_stops": trace.clock_stops,
        "boots": boots,
        "boots_without_stuck_reboots": boots - trace.stuck_reboots,
        # the drift sentinel (the simulated cluster has no drift unless one is injected: every
        # re-base there is a false alarm): re-measures tested, flags, re-bases, and per test its
        # boot number and whether it was re-based
        "sentinel_tests": trace.sentinel_tests,
        "drift_flags": trace.drift_flags,
        "drift_rebases": trace.drift_rebases,
        "sentinel_events": trace.sentinel_events,
        # per verdict: the champion level's bias over its truth (%), and the keeps before it
        "level_bias": trace.level_bias,
        # the round's end: the champion's recorded level over its truth (%; None when the
        # champion does not boot on the landscape), and boots after the last decided experiment
        "final_level_pct": trace.final_level_pct,
        "boots_after_last": trace.boots_after_last,
        # per decided experiment: true effect % then, status, the verdict's rule, boots taken
        "decisions": trace.decisions,
        # the champion's true objective, % of the optimum, before (index 0) and after each
        # decided experiment; first_reached[p]: the first index at which it was >= p %
        "pct_after": [round(p, 3) for p in pct],
        "first_reached": [
            next((i for i, p in enumerate(pct) if p >= level), None) for level in range(101)
        ],
    }


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
    parser.add_argument(
        "--landscapes",
        nargs="*",
        default=[*LANDSCAPES, *NEW_LANDSCAPES],
        help="shipped landscape names or YAML paths (default: all shipped; --seed-stacks and "
        "--new-landscapes pick one group)",
    )
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--seed-stacks",
        action="store_true",
        help="only the seed cards' stacks: " + ", ".join(LANDSCAPES),
    )
    group.add_argument(
        "--new-landscapes",
        action="store_true",
        help="only the landscapes unlike the seed cards: " + ", ".join(NEW_LANDSCAPES),
    )
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
    if args.seed_stacks:
        args.landscapes = list(LANDSCAPES)
    elif args.new_landscapes:
        args.landscapes = list(NEW_LANDSCAPES)
    for name in args.landscapes:  # every landscape read before the first run: one line if not
        try:
            landscape_for(name, args.boot_noise)
        except OrchestrateError as e:
            parser.error(e.message)
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
                    trace = run_loop(
                        landscape,
                        seed,
                        args.budget,
                        {},
                        method,
                        draft_model=PREVIOUS_PROPOSER["draft_model"],
                    )
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
                        "optimum": optimum,
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


if __name__ == "__main__":
    raise SystemExit(main())
