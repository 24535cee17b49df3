"""Where orchestrate stands against the baselines, paired by seed, from ``research.py --json``
files: one row per landscape, the mean final % of the optimum of each method (± its standard
error over seeds), orchestrate's paired difference with each baseline (± its standard error;
bold where it is more than two of them from zero), and #18's other counts for orchestrate.

Runs may come from several files (seeds run in parts, methods run apart); a landscape is
reported on the seeds every method has. A run given twice must agree, or the files are from
different code and the table would mix them: that is refused. ``--strip OUT`` writes the rows
read, without the per-verdict fields the table does not use, as one file to commit::

    .venv/bin/python bench/standing.py bench/results/standing-30seeds.json

``--before FILE`` prints instead orchestrate's runs in the files against its runs of the same
landscape and seed in FILE (code before a change, or a change tried against the code): one row
per landscape, the paired difference of the final % and what moved with it::

    .venv/bin/python bench/standing.py --before bench/results/standing-30seeds-s32.json \
        bench/results/standing-30seeds-s41.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

METHODS = ("orchestrate", "greedy-2%", "optuna-tpe", "grid")
#: What the table reads from a run; ``--strip`` keeps these.
FIELDS = (
    "landscape",
    "method",
    "seed",
    "final_pct",
    "start_pct",
    "pct_after",
    "keeps",
    "keep_effects",
    "keeps_under_1pct",
    "wrong_keeps",
    "wrong_discards_ge5",
    "true_gains_ge5_tried",
    "invalid_promoted",
    "decided",
    "boots",
    "boots_without_stuck_reboots",
)
#: What a run may lack (``--strip`` keeps it when there); the rest every run must carry.
OPTIONAL = frozenset({"start_pct", "keeps", "keep_effects", "invalid_promoted", "boots"})
REQUIRED = tuple(f for f in FIELDS if f not in OPTIONAL)
Key = tuple[str, str, int]


def landscape_name(text: str) -> str:
    """``bench/landscapes/holdout-kv.yaml`` → ``holdout-kv``; a shipped name as it is."""
    return Path(text).name.removesuffix(".yaml")


def read(paths: Sequence[Path]) -> dict[Key, dict[str, Any]]:
    """Every run of the four methods in ``paths`` by (landscape, method, seed), in the order
    the files give them.

    Raises:
        SystemExit: a file that cannot be read as research.py's runs, or a run given twice with
            another final %.
    """
    runs: dict[Key, dict[str, Any]] = {}
    for path in paths:
        for row in _rows(path):
            if row["method"] not in METHODS:
                continue
            key = (landscape_name(row["landscape"]), row["method"], int(row["seed"]))
            seen = runs.get(key)
            if seen is not None and not math.isclose(seen["final_pct"], row["final_pct"]):
                raise SystemExit(
                    f"{path}: {key} ends at {row['final_pct']:.3f} %, another file says "
                    f"{seen['final_pct']:.3f} %: the files are from different code"
                )
            runs[key] = row
    return runs


def _rows(path: Path) -> list[dict[str, Any]]:
    """The runs of one ``research.py --json`` file, each with the fields the table reads.

    Raises:
        SystemExit: one line naming the file and what is wrong with it.
    """
    try:
        rows = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SystemExit(
            f"{path}: cannot read it as JSON ({e}); give research.py --json files"
        ) from None
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise SystemExit(f"{path}: not a list of runs; give research.py --json files")
    for i, r in enumerate(rows):
        missing = [k for k in REQUIRED if k not in r]
        if missing:
            raise SystemExit(
                f"{path}: run {i} lacks {', '.join(missing)}; give research.py --json files "
                "(or files written by --strip)"
            )
    return rows


def mean_se(values: Sequence[float]) -> tuple[float, float]:
    """The mean and its standard error (0 for one value)."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, 0.0
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(var / n)


def difference(mine: Sequence[float], theirs: Sequence[float]) -> str:
    """The paired difference ± its standard error, bold beyond two of them."""
    mean, se = mean_se([a - b for a, b in zip(mine, theirs, strict=True)])
    text = f"{mean:+.2f} ± {se:.2f}".replace("-", "−")
    return f"**{text}**" if abs(mean) > 2 * se and round(mean, 2) != 0 else text


def row(runs: dict[Key, dict[str, Any]], landscape: str) -> str | None:
    """The table's row for ``landscape`` on the seeds every method has (None: no such seed)."""
    seeds = sorted(
        s
        for (name, method, s) in runs
        if name == landscape
        and method == "orchestrate"
        and all((landscape, m, s) in runs for m in METHODS)
    )
    if not seeds:
        return None
    final = {m: [runs[(landscape, m, s)]["final_pct"] for s in seeds] for m in METHODS}
    means = [f"{m:.1f} ± {se:.1f}" for m, se in (mean_se(final[m]) for m in METHODS)]
    diffs = [difference(final["orchestrate"], final[m]) for m in METHODS[1:]]
    ours = [runs[(landscape, "orchestrate", s)] for s in seeds]
    tpe = mean_se(final["optuna-tpe"])[0]
    budget = max(len(r["pct_after"]) - 1 for r in ours)
    reach = [next((i for i, p in enumerate(r["pct_after"]) if p >= tpe), budget + 1) for r in ours]
    there = sum(1 for i in reach if i <= budget)
    decided = max(1, sum(r["decided"] for r in ours))
    boots = sum(r["boots_without_stuck_reboots"] for r in ours) / decided
    wrong = sum(r["wrong_keeps"] for r in ours)
    under = sum(r["keeps_under_1pct"] for r in ours)
    lost = sum(r["wrong_discards_ge5"] for r in ours)
    tried = sum(r["true_gains_ge5_tried"] for r in ours)
    cells = [
        landscape,
        str(len(seeds)),
        *means,
        *diffs,
        f"{sum(reach) / len(reach):.1f} ({there}/{len(seeds)})",
        f"{boots:.2f}",
        f"{wrong}/{decided}",
        str(under),
        f"{lost}/{tried}",
        _kept_nothing(runs, landscape, seeds),
    ]
    return "| " + " | ".join(cells) + " |"


def _kept_nothing(runs: dict[Key, dict[str, Any]], landscape: str, seeds: Sequence[int]) -> str:
    """How many of the paired runs ended with no keep at all, orchestrate's / TPE's / grid's
    (``-`` where a run does not say how many it kept)."""
    counts = []
    for method in ("orchestrate", "optuna-tpe", "grid"):
        keeps = [runs[(landscape, method, s)].get("keeps") for s in seeds]
        if any(k is None for k in keeps):
            return "-"
        counts.append(str(sum(1 for k in keeps if k == 0)))
    return " / ".join(counts)


HEADER = (
    "| landscape | seeds | orchestrate | greedy-2 % | TPE | grid | orchestrate − greedy-2 % "
    "| − TPE | − grid | experiments to TPE's final | boots / decided w/o stuck | wrong keeps "
    "| keeps < 1 % | true ≥ 5 % not kept / tried | runs keeping nothing (ours / TPE / grid) |"
)


PAIRED_HEADER = (
    "| landscape | seeds | final %, before → after | paired diff ± se "
    "| boots / decided w/o stuck | keeps | wrong keeps | keeps < 1 % | runs keeping nothing "
    "| runs alike (final %, boots) |"
)


def paired_row(
    before: dict[Key, dict[str, Any]], after: dict[Key, dict[str, Any]], landscape: str
) -> str | None:
    """Orchestrate's runs of ``landscape`` in ``after`` against those of the same seeds in
    ``before``: the mean final % of each, their paired difference, and the boots per decided
    experiment, keeps, wrong keeps, keeps under 1 % and runs keeping nothing of each (before →
    after), and how many runs ended alike (final % and boots); ``None`` when no seed is in
    both."""
    seeds = sorted(
        s
        for name, method, s in after
        if name == landscape and method == "orchestrate" and (name, method, s) in before
    )
    if not seeds:
        return None
    pairs = [
        (before[(landscape, "orchestrate", s)], after[(landscape, "orchestrate", s)]) for s in seeds
    ]
    olds, news = [p[0] for p in pairs], [p[1] for p in pairs]

    def per_decided(runs: list[dict[str, Any]]) -> float:
        boots = sum(float(r["boots_without_stuck_reboots"]) for r in runs)
        return boots / max(1, sum(int(r["decided"]) for r in runs))

    def moved(count: Callable[[dict[str, Any]], int]) -> str:
        return f"{sum(map(count, olds))} → {sum(map(count, news))}"

    final = [mean_se([r["final_pct"] for r in runs])[0] for runs in (olds, news)]
    alike = sum(
        1 for o, n in pairs if o["final_pct"] == n["final_pct"] and o.get("boots") == n.get("boots")
    )
    cells = [
        landscape,
        str(len(seeds)),
        f"{final[0]:.1f} → {final[1]:.1f}",
        difference([r["final_pct"] for r in news], [r["final_pct"] for r in olds]),
        f"{per_decided(olds):.2f} → {per_decided(news):.2f}",
        moved(_keeps),
        moved(lambda r: int(r["wrong_keeps"])),
        moved(lambda r: int(r["keeps_under_1pct"])),
        moved(lambda r: int(_keeps(r) == 0)),
        str(alike),
    ]
    return "| " + " | ".join(cells) + " |"


def _keeps(run: dict[str, Any]) -> int:
    """How many changes a run kept (its keep effects counted where it does not say)."""
    keeps = run.get("keeps")
    return int(keeps) if keeps is not None else len(run.get("keep_effects") or [])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("files", nargs="+", type=Path, help="research.py --json files")
    parser.add_argument("--strip", type=Path, help="write the runs read here, table fields only")
    parser.add_argument(
        "--before", type=Path, help="orchestrate's runs in the files paired against this file's"
    )
    args = parser.parse_args(argv)
    runs = read(args.files)
    if args.before is not None:
        before = read([args.before])
        print(PAIRED_HEADER)
        print("|" + "---|" * PAIRED_HEADER.count(" | ") + "---|")
        for name in dict.fromkeys(name for name, _, _ in runs):
            line = paired_row(before, runs, name)
            if line is not None:
                print(line)
        return 0
    if args.strip is not None:
        rows = [{k: r[k] for k in FIELDS if k in r} for r in runs.values()]
        args.strip.write_text(json.dumps(rows, indent=1) + "\n")
    print(HEADER)
    print("|" + "---|" * HEADER.count(" | ") + "---|")
    # the landscapes in the order the files first name them (research.py's, for its files)
    for name in dict.fromkeys(name for name, _, _ in runs):
        line = row(runs, name)
        if line is not None:
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
