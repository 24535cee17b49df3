"""A stop the ledger could not hold, kept outside it for the morning, and folded into it once it
takes writes again.

A round stopped because its ledger took no write (its filesystem went read-only, its disk still
full after the last wait, its server still away) cannot record why it stopped where it records
every other stop (``stops.record_stop``): ``orchestrate status`` and the resume found nothing,
and the cells measured whose writes failed were gone. Such a stop is kept in a small JSON file
(``keep``): ``~/.cache/orchestrate/unrecorded/`` (``$ORCHESTRATE_CACHE/unrecorded/`` where that is
set), one file per ledger and cluster, written atomically (a temporary file renamed over it),
with the stop's line and the cells not written. It lives outside the ledger's folder on purpose:
that folder is on the disk that failed. ``status`` reads it (``found``), and the next round's
command folds it into the ledger (``fold``: the cells written to their boots, the stop recorded
as a ``round-stopped`` event, as any stop is) before it resumes, then removes it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from knobs.vocabulary import EventKind
from ledger import CellRecordedAlready, Ledger, LedgerError, UnwrittenCell, ledger_identity
from ledger.redact import Redactor
from orchestrator.timestamps import utc_minute

T = TypeVar("T")

#: The folder's name in ``~/.cache/orchestrate``.
FOLDER = "unrecorded"


@dataclass(frozen=True)
class Unrecorded:
    """A round's stop its ledger could not hold, and the cells it measured and could not
    write, as kept in ``path``."""

    path: Path
    ledger: str
    cluster: str
    round_id: int | None
    stopped_at: datetime
    exit_code: int
    line: str
    cells: list[UnwrittenCell] = field(default_factory=list)

    def said(self) -> str:
        """The stop in one line, for ``status`` and the resume."""
        where = "before a round began" if self.round_id is None else f"round {self.round_id}"
        cells = (
            f"; {len(self.cells)} cell measurement(s) it could not write "
            f"({', '.join(_cell_words(c) for c in self.cells)}) are kept there too"
            if self.cells
            else ""
        )
        return (
            f"the last `orchestrate round` stopped {where} at {utc_minute(self.stopped_at)} "
            f"(exit {self.exit_code}), and its ledger could not record it, so it is kept in "
            f"{self.path}{cells}; the next `orchestrate round` writes "
            f"{'them' if self.cells else 'it'} to the ledger once it takes writes, and resumes: "
            f"{self.line}"
        )

    def recorded(self, cells: int) -> str:
        """This stop folded into the ledger (``fold``), ``cells`` of its cells written."""
        written = f" and {cells} cell measurement(s) it could not write" if cells else ""
        return (
            f"the ledger records now the stop it could not take at "
            f"{utc_minute(self.stopped_at)}{written} (kept in {self.path} until now)"
        )

    def as_json(self) -> dict[str, Any]:
        """For ``status --json``."""
        return {
            "file": str(self.path),
            "round": self.round_id,
            "at": self.stopped_at.isoformat(),
            "exit_code": self.exit_code,
            "reason": self.line,
            "cells": [_cell_words(c) for c in self.cells],
        }


def held_by_ledger(e: LedgerError) -> bool:
    """Whether ``e`` stopped a round with its ledger taking no write (read-only, full, away),
    so that the ledger could not record the stop: not a lease another holds or took (the
    ledger answered), an ID it lacks, or a refusal (a newer schema, a bad URL)."""
    return type(e) is LedgerError and (e.unreachable or e.read_only or bool(e.unwritten))


@dataclass
class Stopping:
    """What a round's command learns as it runs that a stop it cannot record must keep: its
    round, the cells measured whose writes failed, still to be written, and the last command's
    stop still to be folded into the ledger (``unheld``). ``keeps``: whether such a stop is kept
    at all: once the ledger opened, or, before, where it is a server this machine reached
    before (waited for, as a timer's night: ``outages.waiting_for_ledger``); a URL never
    reached, or a SQLite file that does not open, is refused to the person who typed it."""

    url: str
    cluster: str
    round_id: int | None = None
    cells: list[UnwrittenCell] = field(default_factory=list)
    unheld: Unrecorded | None = None
    keeps: bool = False

    def resuming(self, unheld: Unrecorded | None) -> None:
        """The last command's stop the ledger could not hold, to fold before the round."""
        self.unheld = unheld
        if unheld is not None:
            self.cells = list(unheld.cells)

    def attempt(self, ledger: Ledger, run: Callable[[], T], note: Callable[[str], None]) -> T:
        """``run()`` (the round, resumed from the ledger), after the last command's stop is
        folded into the ledger (``fold``, said with ``note``) or the cells an earlier try
        measured and could not write are written; the cells a ``LedgerError`` says it could
        not write are taken from it, kept here for the next try, or for ``keep``."""
        try:
            if self.unheld is not None:
                note(self.unheld.recorded(fold(ledger, self.unheld, self)))
                self.unheld = None
            else:
                self.write_cells(ledger)
            return run()
        except LedgerError as e:
            self.cells.extend(c for c in e.unwritten if c not in self.cells)
            e.unwritten.clear()
            raise

    def write_cells(self, ledger: Ledger) -> int:
        """The cells still to be written, written (one already in the ledger is dropped); how
        many were.

        Raises:
            LedgerError: the ledger took no write; the cells not written are kept here.
        """
        written = 0
        while self.cells:
            c = self.cells[0]
            try:
                ledger.add_cell_result(
                    c.experiment_id, c.boot_id, c.result, spec=c.spec, repeat=c.repeat
                )
                written += 1
            except CellRecordedAlready:
                pass
            except LedgerError as e:
                e.unwritten.clear()  # this one is kept here already
                raise
            self.cells.pop(0)
        return written


@contextmanager
def kept_on_stop(url: str, cluster: str) -> Iterator[Stopping]:
    """The block of a round's command; a ``LedgerError`` that ends it, the ledger taking no
    write (``held_by_ledger``), is kept (``keep``) with the round and the cells not written
    before it goes on up, and its line says where."""
    stopping = Stopping(url, cluster)
    try:
        yield stopping
    except LedgerError as e:
        if stopping.keeps and held_by_ledger(e):
            stopping.cells.extend(c for c in e.unwritten if c not in stopping.cells)
            e.unwritten.clear()
            try:
                path = keep(stopping, e)
            except (OSError, RuntimeError) as failed:  # RuntimeError: no home folder
                e.message += f"; this stop could not be kept for `status` either ({failed})"
            else:
                e.message += f"; this stop is kept in {path} for `status` and the next round"
        raise


def keep(stopping: Stopping, e: LedgerError) -> Path:
    """The stop ``e`` of ``stopping``'s round, its line redacted, and its cells not written,
    written atomically to the file ``found`` reads; its path.

    Raises:
        OSError: the cache folder cannot be written.
    """
    path = _path(stopping.url, stopping.cluster)
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {
        "ledger": ledger_identity(stopping.url),
        "cluster": stopping.cluster,
        "round": stopping.round_id,
        "stopped_at": datetime.now(UTC).isoformat(),
        "exit_code": e.exit_code,
        "line": Redactor.from_environment().text(e.message),
        "cells": [c.model_dump(mode="json") for c in stopping.cells],
    }
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(body, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
    except BaseException:
        with suppress(OSError):
            os.unlink(temporary)
        raise
    return path


def found(url: str, cluster: str) -> Unrecorded | None:
    """The stop kept for ``cluster`` of the ledger at ``url`` (``keep``), if any; a file that
    cannot be read is none (it is a note for the morning, never the record)."""
    try:
        path = _path(url, cluster)
        body = json.loads(path.read_text(encoding="utf-8"))
        return Unrecorded(
            path=path,
            ledger=str(body["ledger"]),
            cluster=str(body["cluster"]),
            round_id=None if body["round"] is None else int(body["round"]),
            stopped_at=datetime.fromisoformat(body["stopped_at"]),
            exit_code=int(body["exit_code"]),
            line=str(body["line"]),
            cells=[UnwrittenCell.model_validate(c) for c in body["cells"]],
        )
    except (OSError, RuntimeError, ValueError, KeyError, TypeError):
        return None


def fold(ledger: Ledger, kept: Unrecorded, stopping: Stopping) -> int:
    """The stop ``kept`` recorded in the ledger as any stop is (``round-stopped``, its time
    the stop's), after its cells (``stopping.cells``, taken from it) are written; its file then
    removed; how many cells were written.

    Raises:
        LedgerError: the ledger still takes no write: the file stays.
    """
    written = stopping.write_cells(ledger)
    ledger.add_event(
        kept.cluster,
        EventKind.ROUND_STOPPED,
        subject="" if kept.round_id is None else str(kept.round_id),
        detail={
            "error": "LedgerError",
            "exit_code": kept.exit_code,
            "stopped_at": kept.stopped_at.isoformat(),
            "recorded_late": True,
        },
        reason=kept.line,
    )
    with suppress(FileNotFoundError):
        kept.path.unlink()
    return written


def _cell_words(c: UnwrittenCell) -> str:
    return f"{c.result.cell} of experiment #{c.experiment_id}, boot {c.boot_id}"


def _path(url: str, cluster: str) -> Path:
    """The file of ``cluster``'s kept stop in the ledger at ``url``: named by the ledger (a
    SQLite file by its absolute path, a server's database by ``server_identity``) and the
    cluster."""
    digest = hashlib.sha256(f"{ledger_identity(url)}\n{cluster}".encode()).hexdigest()[:16]
    if folder := os.environ.get("ORCHESTRATE_CACHE"):
        root = Path(folder)
    else:
        root = Path.home() / ".cache" / "orchestrate"
    return root / FOLDER / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', cluster)}-{digest}.json"
