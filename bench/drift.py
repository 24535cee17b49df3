"""The drift sentinel on a cluster that really drifts: a step injected into the simulated
cluster, the loop before #18 and today's side by side.

Both run the real round loop on one landscape with the same seeds; from boot ``BOOT`` on the
cluster runs ``PCT`` % slower (``cluster.simulated.StepDrift``). ``flag-only`` is the loop
before #18 (``confirm_drift: false``: a re-measurement two standard errors off re-bases the
champion on that one boot); ``confirmed`` is today's (a flag is confirmed with one more boot).
For each: the champion's re-measurements the sentinel tested, its flags and re-bases; the
false alarms (re-bases before the step, or after the drift was already caught, ÷ the
re-measurements tested then); the share of runs whose drift was re-based within 1, 2 and 3
re-measurements after the step, and the mean delay in re-measurements (a run never re-based
counts the re-measurements it had after the step, plus one); boots per decided experiment.
Then today's over the loop before #18, as ratios. Run:

    .venv/bin/python bench/drift.py --landscape flat --step 15@15 --seeds 20 --budget 40
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.ceilings import landscape_for
from bench.research import Trace, run_loop
from cluster.simulated import StepDrift

RULES = {"flag-only": {"confirm_drift": False}, "confirmed": {"confirm_drift": True}}


def step(text: str) -> tuple[float, int]:
    """``--step PCT@BOOT``: the cluster ``PCT`` % slower from boot ``BOOT`` + 1 on."""
    try:
        pct, boot = text.split("@")
        value = (float(pct), int(boot))
    except ValueError:
        value = (-1.0, -1)
    if not (0 < value[0] < 100 and value[1] >= 1):
        raise argparse.ArgumentTypeError(f"{text!r} is not PCT@BOOT, e.g. 15@15")
    return value


def outcome(trace: Trace, after_boot: int) -> dict[str, Any]:
    """One run's sentinel, split at the step: the re-measurements tested until the drift was
    re-based (``delay``, ``None`` if never), and the false alarms around it."""
    delay: int | None = None
    tests = false = 0
    seen_after = 0
    for boot, rebased in trace.sentinel_events:
        if boot > after_boot and delay is None:
            seen_after += 1
            if rebased:
                delay = seen_after
            continue
        tests += 1
        false += rebased
    return {
        "delay": delay,
        "after": seen_after,
        "tests": tests,
        "false": false,
        "all_tests": trace.sentinel_tests,
        "flags": trace.drift_flags,
        "rebases": trace.drift_rebases,
        "boots": trace.boots[-1] if trace.boots else 0,
        "decided": trace.decided,
    }


def summary(runs: list[dict[str, Any]]) -> dict[str, float]:
    """The rule's numbers over its runs."""
    n = len(runs)
    tests = sum(r["tests"] for r in runs)
    delays = [r["delay"] if r["delay"] is not None else r["after"] + 1 for r in runs]
    return {
        "tests": sum(r["all_tests"] for r in runs),
        "flags": sum(r["flags"] for r in runs),
        "rebases": sum(r["rebases"] for r in runs),
        "false_pct": 100 * sum(r["false"] for r in runs) / max(1, tests),
        **{
            f"within_{k}": sum(1 for r in runs if r["delay"] is not None and r["delay"] <= k) / n
            for k in (1, 2, 3)
        },
        "delay": sum(delays) / n,
        "boots_per_decided": sum(r["boots"] for r in runs)
        / max(1, sum(r["decided"] for r in runs)),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--landscape", default="flat", help="a shipped landscape or YAML path")
    parser.add_argument("--step", type=step, default=(15.0, 15), help="PCT@BOOT, e.g. 15@15")
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--budget", type=int, default=40)
    args = parser.parse_args()
    pct, boot = args.step
    landscape = landscape_for(args.landscape, None)
    drift = StepDrift(1 - pct / 100, after_boot=boot)
    results: dict[str, dict[str, float]] = {}
    for rule, policy in RULES.items():
        runs = [
            outcome(run_loop(landscape, seed, args.budget, policy, rule, drift=drift), boot)
            for seed in range(args.seeds)
        ]
        results[rule] = summary(runs)
        print(f"  {rule}: {args.seeds} seeds done", file=sys.stderr)
    print(
        f"# drift sentinel: {args.landscape}, {pct:g}% slower after boot {boot}, "
        f"{args.seeds} seeds, budget {args.budget}\n"
    )
    print(
        "| rule | re-measures / flags / re-bases | false alarms/re-measure "
        "| re-based within 1 / 2 / 3 re-measures | mean delay (re-measures) | boots/decided |"
    )
    print("|---|---|---|---|---|---|")
    for rule, r in results.items():
        print(
            f"| {rule} | {r['tests']:.0f} / {r['flags']:.0f} / {r['rebases']:.0f} "
            f"| {r['false_pct']:.1f}% | {r['within_1']:.0%} / {r['within_2']:.0%} / "
            f"{r['within_3']:.0%} | {r['delay']:.2f} | {r['boots_per_decided']:.2f} |"
        )
    new, old = results["confirmed"], results["flag-only"]

    def ratio(key: str) -> str:
        return "n/a" if old[key] == 0 else f"×{new[key] / old[key]:.2f}"

    print(
        f"\nconfirmed / flag-only: false alarms {ratio('false_pct')}, mean delay "
        f"{ratio('delay')}, re-based within 3 re-measures {ratio('within_3')}, "
        f"boots/decided {ratio('boots_per_decided')}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
