"""``orchestrate report``: a round's report, one self-contained HTML page and its PNGs
(``data`` reads the ledger, ``plots`` draws, ``page`` writes the HTML)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ledger import Ledger
from orchestrator.errors import UsageError
from orchestrator.profile import Profile
from orchestrator.report.data import collect
from orchestrator.report.page import page
from orchestrator.report.records import NothingToReport, ReportData

__all__ = [
    "NothingToReport",
    "ReportData",
    "Written",
    "check_folder",
    "default_dir",
    "write_report",
]

#: The page's file name in the report's folder.
PAGE = "report.html"


@dataclass(frozen=True)
class Written:
    """A report on disk: its page and its pictures."""

    page: Path
    pictures: tuple[Path, ...]
    data: ReportData


def default_dir(round_id: int) -> Path:
    """Where a report goes without ``--out``: ``reports/round-N`` under the current folder."""
    return Path("reports") / f"round-{round_id}"


def check_folder(folder: Path) -> None:
    """Refuse a folder a report cannot be written into (a file, under a file, or in a folder
    this user cannot write), creating nothing: said before the ledger is read and the plots
    are drawn, not after.

    Raises:
        UsageError: it cannot be.
    """
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if existing.exists() and not existing.is_dir():
        what = "is a file" if existing == folder else f"is under {existing}, a file"
        raise UsageError(f"cannot write the report into {folder}: it {what}; name a folder")
    if existing.is_dir() and not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(f"cannot write the report into {folder}: {existing} is not writable")


def write_report(
    profile: Profile, ledger: Ledger, round_id: int | None = None, out: Path | None = None
) -> Written:
    """Write round ``round_id``'s report (default: the last round) into ``out``.

    Raises:
        NothingToReport: the ledger has no such round.
        UsageError: ``out`` cannot be written, or matplotlib is not installed.
    """
    if out is not None:
        check_folder(out)
    # matplotlib is a second of every command's start-up where it is imported: only here
    try:
        from orchestrator.report.plots import all_plots
    except ImportError as e:
        raise UsageError(
            f"the report's plots need matplotlib, which does not import here ({e}); "
            "install it (pip install 'matplotlib>=3.8,<4') and run `orchestrate report`"
        ) from e

    data = collect(profile, ledger, round_id)
    folder = out if out is not None else default_dir(data.round.id)
    check_folder(folder)
    pictures = all_plots(data)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        files = []
        for name, png in pictures.items():
            (folder / name).write_bytes(png)
            files.append(folder / name)
        (folder / PAGE).write_text(page(data, pictures), encoding="utf-8")
    except OSError as e:
        raise UsageError(f"cannot write the report into {folder}: {e.strerror}") from e
    return Written(folder / PAGE, tuple(files), data)
