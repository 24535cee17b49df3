"""``orchestrate export``: results.tsv from the ledger."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from ledger import tsv_text
from orchestrator.cli.common import ProfileOpt, opened
from orchestrator.errors import UsageError
from orchestrator.profile import load_profile


def export(
    path: Annotated[str, typer.Argument(help="file to write, or - for stdout")] = "results.tsv",
    profile: ProfileOpt = None,
) -> None:
    """Write results.tsv: one row per decided experiment, oldest first."""
    prof = load_profile(profile)
    with opened(prof) as o:
        text = tsv_text(o.ledger().experiments(cluster=prof.cluster.name))
    if path == "-":
        sys.stdout.write(text)
        return
    try:
        Path(path).write_text(text)
    except OSError as e:
        raise UsageError(f"cannot write {path}: {e.strerror}") from e
    typer.echo(f"wrote {path} ({text.count(chr(10)) - 1} experiments)", err=True)
