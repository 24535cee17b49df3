"""The root ``orchestrate`` app: every noun's commands joined, and how it runs (``run``,
``main``)."""

from __future__ import annotations

import sys

import typer

from orchestrator.cli.bench import bench
from orchestrator.cli.cluster import cluster_app
from orchestrator.cli.common import make_readable
from orchestrator.cli.experiments import experiments_app
from orchestrator.cli.export import export
from orchestrator.cli.init import init
from orchestrator.cli.known_bad import known_bad_app
from orchestrator.cli.proposals import proposals_app
from orchestrator.cli.report import report
from orchestrator.cli.round import round_
from orchestrator.cli.status import status
from orchestrator.cli.twin import twin_app
from orchestrator.engines.cli import engines_app
from orchestrator.exits import run_app
from orchestrator.interrupts import outliving_readers

app = typer.Typer(
    name="orchestrate",
    help="Autoresearch for LLM-serving clusters: propose one knob change, deploy it, bench it, "
    "judge it against the champion, record everything.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
)
app.add_typer(proposals_app, name="proposals")
app.add_typer(cluster_app, name="cluster")
app.add_typer(known_bad_app, name="known-bad")
app.add_typer(experiments_app, name="experiments")
app.add_typer(twin_app, name="twin")
app.add_typer(engines_app, name="engines")
app.command("round")(round_)
app.command("status")(status)
app.command("export")(export)
app.command("bench")(bench)
app.command("report")(report)
app.command("init")(init)
# last: every command's docstring, as --help shows it (``common.readable``)
make_readable(app)


def run(argv: list[str] | None = None) -> int:
    """Run the CLI; the exit code (errors as one ``Error: …`` line on stderr)."""
    return run_app(app, argv, "orchestrate")


def main() -> None:
    """Console-script entry point: its output outlives its reader (``| head``)."""
    outliving_readers()
    sys.exit(run())
