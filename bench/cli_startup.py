"""How long ``orchestrate --help`` and a TAB of shell completion take, side by side: the CLI as
it is (its commands import the ledger, the proposers and SSH inside the commands that use them)
against the same CLI with everything its commands use imported first (what every call paid
when the command modules imported it at their top).

    .venv/bin/python bench/cli_startup.py [--repeats 7] [--out bench/results/cli-startup.txt]

Each case runs in a fresh interpreter; the table shows the median wall time of ``--repeats``
runs of each and the ratio.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

#: What the command modules imported at their top before (orchestrator/cli/*.py).
EAGER = (
    "agents",
    "agents.study_export",
    "cluster.bench",
    "cluster.deploy",
    "cluster.launcher",
    "cluster.twin.cli",
    "ledger",
    "ledger.mlflow_sink",
    "orchestrator.adopt.build",
    "orchestrator.approval",
    "orchestrator.champion",
    "orchestrator.display",
    "orchestrator.evolution",
    "orchestrator.known_bad",
    "orchestrator.lease",
    "orchestrator.priors",
    "orchestrator.profile",
    "orchestrator.report",
    "orchestrator.round",
    "orchestrator.step_cost",
    "orchestrator.testbed",
)

#: (what a person does, argv, completion words or None)
CASES: tuple[tuple[str, list[str], str | None], ...] = (
    ("orchestrate --help", ["--help"], None),
    ("orchestrate round --help", ["round", "--help"], None),
    ("TAB: orchestrate ro", [], "orchestrate ro"),
    ("TAB: orchestrate round --b", [], "orchestrate round --b"),
    ("TAB: orchestrate round --proposer ", [], "orchestrate round --proposer "),
    ("TAB: orchestrate status --profile ", [], "orchestrate status --profile "),
)


def _once(argv: list[str], words: str | None, eager: bool) -> float:
    preload = "".join(f"import {m}\n" for m in EAGER) if eager else ""
    code = f"{preload}import sys\nfrom orchestrator.cli import run\nsys.exit(run(sys.argv[1:]))"
    env = dict(os.environ)
    if words is not None:
        env.update(
            _ORCHESTRATE_COMPLETE="complete_bash",
            COMP_WORDS=words,
            COMP_CWORD=str(len(words.split()) - (0 if words.endswith(" ") else 1)),
        )
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", code, *argv], env=env, capture_output=True, check=False
    )
    took = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{argv or words}: exit {done.returncode}: {done.stderr[-500:]!r}")
    return took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    rows = ["| what | as it is (s) | everything imported first (s) | ratio |", "|---|---|---|---|"]
    for what, argv, words in CASES:
        lazy: list[float] = []
        eager: list[float] = []
        for _ in range(args.repeats):  # interleaved: a busy machine slows both alike
            lazy.append(_once(argv, words, eager=False))
            eager.append(_once(argv, words, eager=True))
        a, b = statistics.median(lazy), statistics.median(eager)
        rows.append(f"| `{what.strip()}` | {a:.3f} | {b:.3f} | {b / a:.1f}x faster |")
    floor = statistics.median(
        _time([sys.executable, "-c", "import typer"]) for _ in range(args.repeats)
    )
    text = "\n".join(rows) + f"\n\n(python -c 'import typer' alone: {floor:.3f} s)\n"
    print(text)
    if args.out is not None:
        args.out.write_text(text)
    return 0


def _time(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True)
    return time.perf_counter() - start


if __name__ == "__main__":
    sys.exit(main())
