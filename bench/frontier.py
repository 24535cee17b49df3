"""What any decision rule could do at the benchmark's noise: the frontier of boots per decision,
misses of true gains of 5 % or more, and wrong keeps (issue #18's three decision targets).

The changes are the ones the loop actually tried: every decided experiment of the
``orchestrate`` runs in a ``bench/research.py --json`` file (its ``decisions`` field: the true
effect then, the status, the verdict's rule, the boots). A change a crash, the greedy-output
check or the TTFT guardrail decided is settled by something other than the keep rule: it counts
as a decision of one boot that keeps nothing. Every other change is judged again here by each
rule, under the benchmark's noise and the most favourable assumptions a rule could have:

- the champion's level is known exactly (no champion boots; each boot of the change reads its
  true log-effect plus the twin's per-boot noise, N(0, σ²), σ measured on the twin below);
- the true effect's prior is known: the empirical distribution of the effects tried, pooled
  (or, for ``bayes-landscape``, the landscape's own: the rule knows which stack it is on);
- the changes tried do not depend on the rule (the loop's own proposals, as they were).

So each row is an upper bound on what a real rule does: the loop must measure its champion
(today about 0.16 boots per decision) and learn its prior. The rules, each swept over its
parameters, at most ``MAX_BOOTS`` boots a change:

- ``fixed``: n boots, keep if their mean effect reaches a threshold;
- ``two-stage``: one boot; keep at or above ``hi``, discard below ``lo``, in between take one or
  two more and keep if the mean of all reaches ``t2``;
- ``bayes`` / ``bayes-landscape``: the Bayes-optimal sequential rule for the loss ``miss +
  A · wrong keep + c · boots`` (backward induction on the mean of the boots so far): it keeps
  or discards when that costs less than the expected loss of one more boot. Over the weights
  (A, c) these rules trace the lower boundary of every rule's reach with the same information
  (mixing rules at random, which the summary also tries, fills in between).

Counts are those of ``bench/research.py`` (``tally``): a wrong keep is a keep whose true
effect is 0 or less, per decision (settled changes included); a miss is a change worth 5 % or
more that is not kept, per such change tried; boots per decision over every decision (the
stuck-clock re-boots aside). Deterministic by ``--seed``. Run:

    .venv/bin/python bench/frontier.py bench/results/clocks-off-reboots-10seeds.json \
        --json bench/results/frontier-s50.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.ceilings import landscape_for
from bench.frontier_rules import (
    Changes,
    Judge,
    Point,
    bayes_rules,
    fixed_rules,
    replay,
    solvers,
    two_stage_rules,
)
from cluster.twin import noise

#: the done-when's targets: boots per decided experiment, wrong keeps per decision, misses
TARGET_BOOTS, TARGET_WRONG, TARGET_MISS = 1.35, 0.02, 0.10


def load(paths: list[Path]) -> Changes:
    effects: list[float] = []
    where: list[str] = []
    settled: dict[str, int] = {}
    boots = own = decided = misses = gains = wrong = 0
    for path in paths:
        for row in json.loads(path.read_text()):
            if row["method"] != "orchestrate" or "decisions" not in row:
                continue
            name = row["landscape"]
            settled.setdefault(name, 0)
            boots += row["boots_without_stuck_reboots"]
            decided += row["decided"]
            misses += row["wrong_discards_ge5"]
            gains += row["true_gains_ge5_tried"]
            wrong += row["wrong_keeps"]
            for effect, status, rule, took in row["decisions"]:
                own += took
                judged = status in ("keep", "discard", "inconclusive") and rule != "ttft-guardrail"
                if judged and effect is not None:
                    effects.append(float(effect))
                    where.append(name)
                else:
                    settled[name] += 1
    if not effects:
        raise SystemExit(
            f"no orchestrate run with a decisions field in {', '.join(map(str, paths))}"
        )
    loop = {
        "decisions": decided,
        "boots_per_decision": boots / decided,
        "own_boots_per_decision": own / decided,
        "champion_boots_per_decision": (boots - own) / decided,
        "miss_rate": misses / gains if gains else 0.0,
        "gains_tried": gains,
        "wrong_keep_rate": wrong / decided,
    }
    return Changes(np.array(effects), where, settled, loop)


def twin_sigma(names: list[str], boots: int, seed: int) -> float:
    """The sd of one boot's log objective on the twin (the default config of each landscape,
    every reference cell run once: boot-to-boot, run-to-run and acceptance noise together)."""
    logs: list[float] = []
    for name in names:
        landscape = landscape_for(name, None)
        config = landscape.knob_space().default_config().as_dict()
        rng = random.Random(seed)
        mine = []
        for _ in range(boots):
            factor = noise.lognormal(rng, landscape.noise.boot_to_boot)
            cells = [landscape.sample(config, c, rng, factor) for c in landscape.cells()]
            mine.append(math.log(sum(c.output_throughput for c in cells if c is not None)))
        mean = sum(mine) / len(mine)
        logs.extend(v - mean for v in mine)
    return math.sqrt(sum(v * v for v in logs) / (len(logs) - len(names)))


def pareto(points: list[Point]) -> list[Point]:
    """The points no other beats on all three rates (fewer or equal everywhere, one less)."""
    arr = np.array([(p.boots, p.miss, p.wrong) for p in points])
    keep = []
    for i, v in enumerate(arr):
        beaten = np.all(arr <= v, axis=1) & np.any(arr < v, axis=1)
        if not beaten.any():
            keep.append(points[i])
    return sorted(keep, key=lambda p: (p.boots, p.miss))


def best(points: list[Point], boots: float, wrong: float, every: bool = False) -> Point | None:
    """The least miss rate within ``boots`` per decision and ``wrong`` keeps per decision
    (``every``: on every landscape, not only all together)."""
    ok = [
        p
        for p in points
        if p.boots <= boots + 1e-9
        and p.wrong <= wrong + 1e-9
        and (not every or all(v[2] <= wrong + 1e-9 for v in (p.per_landscape or {}).values()))
    ]
    return min(ok, key=lambda p: (p.miss, p.boots), default=None)


def fewest_boots(points: list[Point], wrong: float) -> Point | None:
    """The fewest boots per decision with misses within the target and ``wrong`` keeps."""
    ok = [p for p in points if p.miss <= TARGET_MISS + 1e-9 and p.wrong <= wrong + 1e-9]
    return min(ok, key=lambda p: (p.boots, p.miss), default=None)


def hull(points: list[Point], wrong: float) -> list[Point]:
    """The lower convex hull in (boots, misses) of the rules within ``wrong`` keeps: what
    mixing two of them at random per change reaches (their wrong keeps mix within it too)."""
    chain: list[Point] = []
    for p in sorted(
        (p for p in points if p.wrong <= wrong + 1e-9), key=lambda p: (p.boots, p.miss)
    ):
        while len(chain) >= 2:
            (a, b), c = chain[-2:], p
            if (b.boots - a.boots) * (c.miss - a.miss) - (b.miss - a.miss) * (
                c.boots - a.boots
            ) > 0:
                break
            chain.pop()
        chain.append(p)
    return chain


def mixed(
    points: list[Point], wrong: float, *, boots: float | None = None
) -> dict[str, Any] | None:
    """Two rules mixed at random per change: the least misses within ``boots`` per decision,
    or (``boots`` None) the fewest boots for misses within the target."""
    chain = hull(points, wrong)
    for a, b in itertools.pairwise(chain):
        if boots is not None:
            if not a.boots <= boots <= b.boots:
                continue
            share = (b.boots - boots) / (b.boots - a.boots) if b.boots > a.boots else 1.0
        else:
            if not b.miss <= TARGET_MISS <= a.miss:
                continue
            share = (TARGET_MISS - b.miss) / (a.miss - b.miss) if a.miss > b.miss else 1.0
        return {
            "rules": [a.row(), b.row()],
            "share_of_first": round(share, 4),
            "boots_per_decision": round(share * a.boots + (1 - share) * b.boots, 4),
            "miss_rate": round(share * a.miss + (1 - share) * b.miss, 4),
            "wrong_keep_rate": round(share * a.wrong + (1 - share) * b.wrong, 5),
        }
    return None


def pct(v: float | None) -> str:
    return "—" if v is None or math.isnan(v) else f"{100 * v:.1f} %"


def describe(p: Point | None) -> str:
    if p is None:
        return "none in the sweep"
    params = ", ".join(f"{k} {v:.3g}" for k, v in p.params.items())
    return (
        f"{p.family} ({params}): {p.boots:.3f} boots/decision, misses {pct(p.miss)}, "
        f"wrong keeps {100 * p.wrong:.2f} %"
    )


#: what a rule knows of the effects it judges: the pooled prior, or each landscape's own
KNOWS = {
    "pooled prior": ("fixed", "two-stage", "bayes"),
    "each landscape's prior": ("fixed", "two-stage", "bayes", "bayes-landscape"),
}
LEVELS = (1.0, 1.1, 1.2, 1.3, 1.35, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0)


def answer(
    points: list[Point], budget: float, overhead: float, again: Callable[[Point], Point]
) -> dict[str, Any]:
    """The two questions for one set of rules, with the rule found run again on fresh draws."""
    q1, q2 = best(points, budget, TARGET_WRONG), fewest_boots(points, TARGET_WRONG)
    q1_every = best(points, budget, TARGET_WRONG, every=True)
    out: dict[str, Any] = {"boots_budget_for_rules": round(budget, 4)}
    for key, p in (
        ("least_miss", q1),
        ("least_miss_every_landscape", q1_every),
        ("fewest_boots", q2),
    ):
        fresh = None if p is None else again(p)
        out[key] = (
            None
            if p is None
            else {
                **p.row(),
                "fresh_draws": None if fresh is None else fresh.row(),
                "per_landscape": {
                    k: [
                        round(v[0], 3),
                        None if math.isnan(v[1]) else round(v[1], 3),
                        round(v[2], 4),
                    ]
                    for k, v in (p.per_landscape or {}).items()
                },
            }
        )
        print(f"  {key.replace('_', ' ')}: {describe(p)}")
        if fresh is not None:
            print(f"    on fresh draws: {describe(fresh)}")
    if q2 is not None:
        print(f"    → {q2.boots + overhead:.3f} boots per decided experiment with the champion's")
    out["least_miss_mixed"] = mixed(points, TARGET_WRONG, boots=budget)
    out["fewest_boots_mixed"] = mixed(points, TARGET_WRONG)
    if out["least_miss_mixed"]:
        print(f"  mixing two rules: misses {pct(out['least_miss_mixed']['miss_rate'])}", end="")
    if out["fewest_boots_mixed"]:
        total = out["fewest_boots_mixed"]["boots_per_decision"] + overhead
        print(f"; ≤ 10 % misses at {total:.3f} boots per decided experiment", end="")
    print()
    return out


def report(
    changes: Changes,
    sigma: float,
    families: dict[str, list[Point]],
    again: Callable[[Point], Point],
) -> dict[str, Any]:
    loop = changes.loop
    print(
        f"{len(changes.effect)} judged changes (+{sum(changes.settled.values())} settled by a "
        f"crash, the greedy check or the TTFT guardrail), {int(changes.gain.sum())} true ≥ 5 % "
        f"gains, {int(changes.wrong.sum())} of 0 or less; σ per boot {sigma:.4f}"
    )
    print(
        f"the loop on these decisions: {loop['boots_per_decision']:.3f} boots/decision "
        f"({loop['own_boots_per_decision']:.3f} its changes', "
        f"{loop['champion_boots_per_decision']:.3f} the champion's), misses "
        f"{pct(loop['miss_rate'])}, wrong keeps {100 * loop['wrong_keep_rate']:.2f} %\n"
    )
    names = list(families)
    print("Least miss rate of true ≥ 5 % gains at most so many boots per decision (champion known)")
    strict = (("bayes", 0.005), ("bayes", 0.001), ("bayes-landscape", 0.001))
    print(
        "| boots/decision ≤ | "
        + " | ".join(f"{n}, wrong ≤ 2 %" for n in names)
        + "".join(f" | {n}, wrong ≤ {100 * w:g} %" for n, w in strict)
        + " |"
    )
    print("|---" * (len(names) + len(strict) + 1) + "|")
    table = []
    for level in LEVELS:
        row = [best(families[n], level, TARGET_WRONG) for n in names]
        row += [best(families[n], level, w) for n, w in strict]
        misses = [None if p is None else p.miss for p in row]
        columns = [*(f"{n}@2%" for n in names), *(f"{n}@{100 * w:g}%" for n, w in strict)]
        table.append({"boots": level, "columns": columns, "miss": misses})
        print(f"| {level:.2f} | " + " | ".join(pct(m) for m in misses) + " |")
    answers: dict[str, Any] = {}
    overhead = loop["champion_boots_per_decision"]
    for knows, fams in KNOWS.items():
        points = [p for f in fams for p in families[f]]
        for label, extra in (("champion known", 0.0), ("champion's boots as today", overhead)):
            print(f"\n{knows}, {label} (the rule's boots ≤ {TARGET_BOOTS - extra:.3f}/decision):")
            answers[f"{knows}, {label}"] = answer(points, TARGET_BOOTS - extra, extra, again)
    front = {
        knows: [p.row() for p in pareto([p for f in fams for p in families[f]])]
        for knows, fams in KNOWS.items()
    }
    return {"table": table, "answers": answers, "pareto": front}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("runs", nargs="+", type=Path, help="bench/research.py --json files")
    parser.add_argument("--reps", type=int, default=40, help="noisy replays of each change")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sigma-boots", type=int, default=1000, help="twin boots per landscape")
    parser.add_argument("--json", type=Path, help="write the table, answers, frontiers here")
    args = parser.parse_args()
    changes = load(args.runs)
    names = [n for n in sorted(changes.settled)]
    sigma = twin_sigma(names, args.sigma_boots, args.seed)
    judge = Judge(changes, sigma, args.reps, args.seed)
    bayes = {"bayes": solvers(judge, False), "bayes-landscape": solvers(judge, True)}
    families = {
        "fixed": fixed_rules(judge),
        "two-stage": two_stage_rules(judge),
        **{name: bayes_rules(judge, name, parts) for name, parts in bayes.items()},
    }
    fresh = Judge(changes, sigma, args.reps, args.seed + 1)
    summary = report(changes, sigma, families, lambda p: replay(fresh, p, bayes))
    if args.json:
        out = {
            "inputs": [str(p) for p in args.runs],
            "seed": args.seed,
            "reps": args.reps,
            "sigma_per_boot": sigma,
            "judged_changes": len(changes.effect),
            "settled_changes": changes.settled,
            "gains_ge5": int(changes.gain.sum()),
            "loop": changes.loop,
            **summary,
            "rules_swept": {name: len(ps) for name, ps in families.items()},
        }
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
