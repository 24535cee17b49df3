"""The research benchmark's report: a table per landscape (``report``), orchestrate against
every other method (``report_ratios``) and orchestrate's decisions by their true effect
(``report_decisions``), from the runs ``bench/research.py`` summarised.
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any


def experiments_to(row: dict[str, Any], pct: float, budget: int) -> int:
    """The first experiment after which ``row``'s champion was at ``pct`` % of the optimum or
    more (0: the default already was; a run that never got there counts ``budget`` + 1)."""
    return next((i for i, p in enumerate(row["pct_after"]) if p >= pct), budget + 1)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


COLUMNS = (
    "landscape",
    "method",
    "reached 99%",
    "experiments to 99%",
    "boots to 99%",
    "final % of optimum",
    "experiments to TPE's final %",
    "wrong keeps (% of decided)",
    "keeps (true < 1%)",
    "wrong discards ≥5%",
    "true ≥5% discarded / tried",
    "invalid promoted",
    "boots/decided",
    "boots/decided w/o stuck",
    "boot failures/run",
    "champion re-measures/run",
    "sentinel: re-measures / flags / re-bases",
    "false alarms/re-measure",
    "stuck-clock boots/run",
)


def report(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    """Print a table per landscape and the ratios as Markdown."""
    noise = "" if args.boot_noise is None else f", boot-to-boot noise {args.boot_noise:g}"
    if args.policy:
        noise += f", orchestrate's verdict settings {json.dumps(args.policy)}"
    print(
        f"# research efficiency: {args.seeds} seeds, budget {args.budget} experiments a run"
        f"{noise}\n"
    )
    print(
        "experiments to TPE's final %: the first experiment after which the champion was at "
        "optuna-tpe's mean final % of the optimum on that landscape (0: the default already "
        "was; never: budget + 1), and in how many runs; keeps (true < 1%): keeps, and of them "
        "those whose true effect was under +1 % or invalid; true ≥5% discarded / tried: changes "
        "with a true effect of +5 % or more that were not kept / that were tried; w/o stuck: "
        "boots set aside for a node's stuck clocks (and taken again) not counted"
    )
    summary: dict[tuple[str, str], dict[str, float]] = {}
    for name in args.landscapes:
        mine = [r for r in rows if r["landscape"] == name]
        tpe = [r["final_pct"] for r in mine if r["method"] == "optuna-tpe"]
        target = _mean(tpe) if tpe else None
        start = _mean([r["start_pct"] for r in mine])
        print(f"\n## {name}\n")
        print(
            f"default config at {start:.1f}% of the optimum"
            + ("" if target is None else f"; optuna-tpe's mean final {target:.1f}%")
            + "\n"
        )
        print("| " + " | ".join(COLUMNS) + " |")
        print("|" + "---|" * len(COLUMNS))
        for method in args.methods:
            runs = [r for r in mine if r["method"] == method]
            cells, summary[(name, method)] = table_row(runs, name, method, target, args.budget)
            print("| " + " | ".join(cells) + " |")
    if "orchestrate" in args.methods:
        report_ratios(summary, args)
        report_decisions([r for r in rows if r["method"] == "orchestrate"], args.landscapes)


#: true-effect buckets of ``report_decisions`` (lower edges, %)
EFFECT_BUCKETS = ((20.0, "≥ 20 %"), (10.0, "10–20 %"), (5.0, "5–10 %"), (1.0, "1–5 %"))


def report_decisions(runs: list[dict[str, Any]], names: list[str]) -> None:
    """orchestrate's decided experiments by their true effect: tried / kept / boots each, and
    the verdict rules of the ≥ 5 % changes it did not keep."""
    print("\n## orchestrate's decisions by true effect\n")
    print("tried / kept / boots each (measure, repeat and confirm boots of the experiment)\n")
    heads = [label for _, label in EFFECT_BUCKETS]
    print("| landscape | " + " | ".join(heads) + " | < 1 % | ≥ 5 % not kept, by rule |")
    print("|---|" + "---|" * (len(heads) + 2))
    for name in names:
        tried: dict[str, list[tuple[str, int]]] = {}
        rules: dict[str, int] = {}
        for run in (r for r in runs if r["landscape"] == name):
            for effect, status, rule, took in run.get("decisions", []):
                if effect is None:
                    continue
                label = next((lab for low, lab in EFFECT_BUCKETS if effect >= low), "< 1 %")
                tried.setdefault(label, []).append((status, took))
                if effect >= 5.0 and status != "keep":
                    rules[f"{status}/{rule}"] = rules.get(f"{status}/{rule}", 0) + 1
        why = ", ".join(f"{k} {v}" for k, v in sorted(rules.items(), key=lambda kv: -kv[1]))
        cells = [_decided_cell(tried.get(h, [])) for h in [*heads, "< 1 %"]]
        print(f"| {name} | " + " | ".join(cells) + f" | {why} |")


def _decided_cell(got: list[tuple[str, int]]) -> str:
    """``tried / kept / boots each`` of one bucket's (status, boots) decisions."""
    if not got:
        return "-"
    kept = sum(1 for status, _ in got if status == "keep")
    return f"{len(got)} / {kept} / {sum(t for _, t in got) / len(got):.2f}"


def table_row(
    runs: list[dict[str, Any]], name: str, method: str, target: float | None, budget: int
) -> tuple[list[str], dict[str, float]]:
    """One landscape × method row of the table, and what the ratios need."""
    reached = [r for r in runs if r["experiments_to_99"] is not None]
    # a run that never reached 99% counts as budget + 1 experiments
    exp = _mean([r["experiments_to_99"] or budget + 1 for r in runs])
    boots = _mean([r["boots_to_99"] or r["boots"] + 1 for r in runs])
    decided = max(1, sum(r["decided"] for r in runs))
    wrong = sum(r["wrong_keeps"] for r in runs)
    final = _mean([r["final_pct"] for r in runs])
    if target is None:
        to_tpe = "n/a"
    else:
        got = [experiments_to(r, target, budget) for r in runs]
        there = sum(1 for g in got if g <= budget)
        to_tpe = f"{_mean([float(g) for g in got]):.1f} ({there}/{len(runs)})"
    discarded = sum(r["wrong_discards_ge5"] for r in runs)
    tried = sum(r["true_gains_ge5_tried"] for r in runs)
    cells = [
        name,
        method,
        f"{len(reached)}/{len(runs)}",
        f"{exp:.1f}",
        f"{boots:.1f}",
        f"{final:.1f}",
        to_tpe,
        f"{wrong} ({100 * wrong / decided:.1f}%)",
        f"{sum(r['keeps'] for r in runs)} ({sum(r['keeps_under_1pct'] for r in runs)})",
        str(discarded),
        f"{discarded}/{tried}" + (f" ({100 * discarded / tried:.0f}%)" if tried else ""),
        str(sum(r["invalid_promoted"] for r in runs)),
        f"{sum(r['boots'] for r in runs) / decided:.2f}",
        f"{sum(r['boots_without_stuck_reboots'] for r in runs) / decided:.2f}",
        f"{_mean([r['boot_failures'] for r in runs]):.1f}",
        f"{_mean([r['remeasures'] for r in runs]):.1f}",
        sentinel_cells(runs),
        false_alarms(runs),
        f"{_mean([r['stuck_boots'] for r in runs]):.1f}",
    ]
    return cells, {"exp": exp, "final": final}


def sentinel_cells(runs: list[dict[str, Any]]) -> str:
    """The drift sentinel's re-measures, flags and re-bases, summed over runs (``-`` for a
    method without a sentinel)."""
    tests = sum(r.get("sentinel_tests", 0) for r in runs)
    if not tests:
        return "-"
    flags = sum(r["drift_flags"] for r in runs)
    return f"{tests} / {flags} / {sum(r['drift_rebases'] for r in runs)}"


def false_alarms(runs: list[dict[str, Any]]) -> str:
    """Re-bases ÷ re-measures tested: on a cluster without drift, every re-base is false."""
    tests = sum(r.get("sentinel_tests", 0) for r in runs)
    if not tests:
        return "-"
    return f"{100 * sum(r['drift_rebases'] for r in runs) / tests:.1f}%"


def report_ratios(
    summary: dict[tuple[str, str], dict[str, float]], args: argparse.Namespace
) -> None:
    """orchestrate against every other method, per landscape."""
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
