"""``orchestrate export``: results.tsv from the ledger, and the ledger as an Optuna study."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from orchestrator.cli.common import ProfileOpt, opened
from orchestrator.errors import UsageError

if TYPE_CHECKING:
    from agents.study_export import StudyTrial
    from ledger import ExperimentRecord


def export(
    path: Annotated[
        str | None,
        typer.Argument(
            metavar="PATH",
            help="a file to write; a directory, which must exist, to write its results.tsv (a "
            "path ending in / that is not there is refused); or - for stdout (default: "
            "results.tsv)",
        ),
    ] = None,
    optuna_storage: Annotated[
        str | None,
        typer.Option(
            "--optuna-storage",
            metavar="URL",
            help="also (without PATH: only) add the decided experiments to an Optuna study in "
            "this RDB storage (sqlite:///optuna.db), for optuna-dashboard",
        ),
    ] = None,
    study: Annotated[
        str | None,
        typer.Option("--study", help="the Optuna study's name (default: the cluster's name)"),
    ] = None,
    profile: ProfileOpt = None,
) -> None:
    """Write results.tsv: one row per decided experiment, oldest first, to PATH (a file, or
    into a directory that exists); or add them to an Optuna study (with --optuna-storage): one
    trial each, a re-export adds the new ones."""
    from agents.study_export import export_study
    from ledger import tsv_text
    from orchestrator import knob_renames, left_open
    from orchestrator.compared_with import tsv_notes
    from orchestrator.profile import load_profile

    prof = load_profile(profile)
    with opened(prof) as o:
        ledger = o.ledger(create=False)
        # a stop an earlier release recorded `discard` and left open reads `inconclusive`
        experiments = left_open.read(
            prof.verdict, ledger, ledger.experiments(cluster=prof.cluster.name)
        )
        # the champion's row says its level in force where it was measured again since, a
        # row whose objective beside its champion's reads against its Δ what the Δ is against
        notes = tsv_notes(prof, ledger)
        # the knobs the profile dropped, as recorded: a change of one is no point of the champion
        dropped = knob_renames.retired(prof, ledger)
    if optuna_storage is not None:
        name = study or prof.cluster.name
        trials = list(_trials(experiments))
        done = export_study(optuna_storage, name, prof.space, trials, dropped)
        typer.echo(
            f"study {done.study!r} in {optuna_storage}: {done.added} trial(s) added, "
            f"{done.present} there already",
            err=True,
        )
        if done.fitted:
            typer.echo("fitted to the profile's knobs: " + "; ".join(done.fitted), err=True)
        if path is None:
            return
    text = tsv_text(experiments, notes)
    path = path or "results.tsv"
    if path == "-":
        try:
            sys.stdout.write(text)
            sys.stdout.flush()
        except BrokenPipeError:  # `| head`: the reader has what it wanted
            # what is left unflushed goes nowhere at exit (the Python docs' way for SIGPIPE)
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except OSError as e:
            raise UsageError(f"cannot write results.tsv to stdout: {e.strerror}") from e
        return
    written = write_tsv(path, text)
    rows = text.count(chr(10)) - 1
    typer.echo(f"wrote {written} ({rows} experiment{'' if rows == 1 else 's'})", err=True)


def write_tsv(where: str, text: str) -> Path:
    """Write ``text`` to ``where`` (a directory: its ``results.tsv``) and return the file. A
    regular file is replaced whole (written beside it, then renamed over it), so a disk that
    fills mid-write leaves the results.tsv before it as it was; a device or a pipe is written
    to as it is.

    Raises:
        UsageError: the path cannot be written (its line says why).
    """
    path = Path(where)
    if path.is_dir():
        path = path / "results.tsv"
    elif where.endswith("/"):
        raise UsageError(f"cannot write {where}: no such directory")
    if path.exists() and not path.is_file():
        try:
            path.write_text(text)
        except OSError as e:
            raise UsageError(f"cannot write {path}: {e.strerror}") from e
        return path
    target = path.resolve()  # a link: the file it names is replaced, not the link
    aside = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        aside.write_text(text)
        os.replace(aside, target)
    except OSError as e:
        aside.unlink(missing_ok=True)
        raise UsageError(f"cannot write {path}: {e.strerror}") from e
    return path


def _trials(experiments: Iterable[ExperimentRecord]) -> Iterable[StudyTrial]:
    """The decided experiments as study trials (see ``agents.study_export``)."""
    from agents.study_export import StudyTrial
    from knobs.vocabulary import MEASURED, State

    for e in experiments:
        if e.state != State.DECIDED or e.status is None:
            continue
        measured = e.status in MEASURED and e.objective is not None
        attrs: dict[str, object] = {
            "status": str(e.status),
            "kind": str(e.kind),
            "round": e.round_id,
            "description": e.description,
        }
        if e.knob is not None:
            attrs.update(knob=e.knob, value=e.value)
        if e.coupled_knob is not None:  # a coupled move: its enabling knob too
            attrs.update(coupled_knob=e.coupled_knob, coupled_value=e.coupled_value)
        if e.delta_pct is not None:
            attrs["delta_pct"] = e.delta_pct
        if e.objective is not None and not measured:
            attrs["untrusted_objective"] = e.objective
        if e.failure_class is not None:
            attrs["failure_class"] = str(e.failure_class)
        yield StudyTrial(e.id, dict(e.config), e.objective if measured else None, attrs)
