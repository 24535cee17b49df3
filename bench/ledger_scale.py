"""Nights on one ledger: what one experiment costs the loop (not the cluster) as the ledger grows.

A user runs ``orchestrate round`` night after night on one ledger, so every decision of a
later night is made over the experiments of all the nights before: the noise model, the
knobs' learned priors, the regions barred, the proposer's history are all read from it. This
runs rounds of ``--budget`` experiments one after another on one ledger (the real round loop on
a simulated cluster of ``--landscape``, its boots instant, as ``bench/research.py`` runs it) and
prints, round by round, the ledger's size, the loop's wall time per experiment and the SQL
statements it sent per experiment; then the ratio of the last round's to the first's. A loop
whose cost per experiment grows with the ledger shows it here long before a user's ledger of a
few thousand experiments does. Rounds stop early when the ledger has decided every change
(``exhausted``). ``--against DIR`` runs the same rounds in another checkout too (a release
before a change: ``git worktree add DIR COMMIT``), in a process of its own, and prints the two
side by side with their ratios. Run:

    .venv/bin/python bench/ledger_scale.py --rounds 6 --budget 40 [--against DIR]
    .venv/bin/python bench/ledger_scale.py --ledger postgresql+psycopg://…   # a scratch database
"""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import optuna
from rich.console import Console
from sqlalchemy import event
from sqlalchemy.engine import Engine

# the tree whose loop is measured: this checkout, or the one ``--against`` names (its process
# is this script with ``--tree``); only names every release since the research bench has
sys.path.insert(
    0,
    sys.argv[sys.argv.index("--tree") + 1]
    if "--tree" in sys.argv[:-1]
    else str(Path(__file__).resolve().parent.parent),
)

from agents import OptunaProposer
from bench.research import profile_for
from cluster.simulated import SimulatedTestbed
from cluster.twin.landscape import load_landscape
from ledger import Ledger
from orchestrator.approval import ApprovalGate
from orchestrator.display import RoundDisplay
from orchestrator.errors import OrchestrateError
from orchestrator.round import RoundOptions, RoundRunner
from orchestrator.testbed import NullSink


class Statements:
    """Counts the SQL statements every engine of this process sends while it is open."""

    def __init__(self) -> None:
        self.count = 0

    def __enter__(self) -> Statements:
        event.listen(Engine, "before_cursor_execute", self._one)
        return self

    def __exit__(self, *_exc: object) -> None:
        event.remove(Engine, "before_cursor_execute", self._one)

    def _one(self, *_: Any) -> None:
        self.count += 1


def grow(url: str, landscape_name: str, rounds: int, budget: int) -> list[dict[str, Any]]:
    """``rounds`` rounds of ``budget`` on one ledger at ``url``; one row per round."""
    landscape = load_landscape(landscape_name)
    profile = profile_for(landscape, {})
    rows: list[dict[str, Any]] = []
    with Statements() as statements, Ledger(url) as ledger:
        testbed = SimulatedTestbed(landscape, 0, None)
        for r in range(rounds):
            runner = RoundRunner(
                profile,
                ledger,
                NullSink(),
                testbed,
                OptunaProposer(seed=r),
                ApprovalGate(ledger, "auto"),
                RoundDisplay(Console(file=io.StringIO())),
            )
            before = len(ledger.experiments(cluster=profile.cluster.name))
            sent = statements.count
            started = time.perf_counter()
            report = runner.run(RoundOptions(budget=budget, proposer="optuna", approve="auto"))
            took = time.perf_counter() - started
            after = len(ledger.experiments(cluster=profile.cluster.name))
            ran = after - before
            rows.append(
                {
                    "round": r,
                    "ledger_before": before,
                    "experiments": ran,
                    "seconds": round(took, 3),
                    "ms_per_experiment": round(1000 * took / ran, 1) if ran else None,
                    "statements_per_experiment": round((statements.count - sent) / ran)
                    if ran
                    else None,
                    "stopped_by": report.stopped_by,
                }
            )
            print(
                f"  round {r}: ledger {before} → {after} experiments, {took:.1f}s "
                f"({report.stopped_by})",
                file=sys.stderr,
            )
            if report.stopped_by == "exhausted":
                break
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--landscape", default="flat-knobs-matter")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--budget", type=int, default=40)
    parser.add_argument("--ledger", help="a scratch ledger URL (default: a temporary SQLite)")
    parser.add_argument("--against", type=Path, help="another checkout, measured alike")
    parser.add_argument("--tree", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    try:
        load_landscape(args.landscape)  # read before any round: one line if it is not one
    except OrchestrateError as e:
        parser.error(e.message)
    if args.against is not None and args.ledger:
        parser.error("--against runs on temporary SQLite ledgers only (no --ledger)")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        theirs = None if args.against is None else _against(args, Path(tmp))
        url = args.ledger or f"sqlite:///{tmp}/ledger.db"
        rows = grow(url, args.landscape, args.rounds, args.budget)
    if args.tree is not None:  # the process ``--against`` started: its rows are the report
        assert args.json is not None
        args.json.write_text(json.dumps(rows))
        return 0
    where = "SQLite" if url.startswith("sqlite") else url.split(":", 1)[0]
    print(
        f"# one ledger, night after night: {args.landscape}, "
        f"budget {args.budget} a round, {where}\n"
    )
    _table("this checkout", rows, args.budget)
    if theirs is not None:
        _table(str(args.against), theirs, args.budget)
        print("\nthis checkout / the other, round by round (ms per experiment, statements):")
        for ours, other in zip(rows, theirs, strict=False):
            if ours["ms_per_experiment"] and other["ms_per_experiment"]:
                print(
                    f"- round {ours['round']} (ledger {ours['ledger_before']} / "
                    f"{other['ledger_before']}): "
                    f"×{ours['ms_per_experiment'] / other['ms_per_experiment']:.2f}, "
                    f"×{ours['statements_per_experiment'] / other['statements_per_experiment']:.2f}"
                )
    if args.json:
        args.json.write_text(json.dumps({"this": rows, "against": theirs}, indent=1))
    return 0


def _against(args: argparse.Namespace, tmp: Path) -> list[dict[str, Any]]:
    """The same rounds in the checkout ``--against`` names, in a process of its own."""
    out = tmp / "against.json"
    command = [sys.executable, __file__, "--tree", str(args.against.resolve()), "--json", str(out)]
    command += ["--landscape", args.landscape, "--rounds", str(args.rounds)]
    command += ["--budget", str(args.budget)]
    subprocess.run(command, check=True)
    rows: list[dict[str, Any]] = json.loads(out.read_text())
    return rows


def _table(title: str, rows: list[dict[str, Any]], budget: int) -> None:
    print(f"\n## {title}\n")
    print(
        "| round | ledger before | experiments | ms / experiment "
        "| SQL statements / experiment | stopped by |"
    )
    print("|---|---|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['round']} | {row['ledger_before']} | {row['experiments']} "
            f"| {row['ms_per_experiment']} | {row['statements_per_experiment']} "
            f"| {row['stopped_by']} |"
        )
    full = [r for r in rows if r["experiments"] >= budget]
    if len(full) >= 2:
        first, last = full[0], full[-1]
        print(
            f"\nround {last['round']} / round {first['round']} (the full rounds, the ledger at "
            f"{first['ledger_before']} → {last['ledger_before']} experiments as each started): "
            f"ms per experiment ×{last['ms_per_experiment'] / first['ms_per_experiment']:.2f}, "
            f"statements per experiment "
            f"×{last['statements_per_experiment'] / first['statements_per_experiment']:.2f}"
        )


if __name__ == "__main__":
    raise SystemExit(main())
