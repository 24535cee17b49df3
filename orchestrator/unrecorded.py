"""A stop the ledger could not hold, kept outside it for the morning, and folded into it once it
takes writes again.

A round stopped because its ledger took no write (its filesystem went read-only, its disk still
full after the last wait, its server still away) cannot record why it stopped where it records
every other stop (``stops.record_stop``): ``orchestrate status`` and the resume found nothing,
and the cells measured whose writes failed were gone. Such a stop is kept in a small JSON file
(``keep``): ``~/.cache/orchestrate/unrecorded/`` (``$ORCHESTRATE_CACHE/unrecorded/`` where that is
set), one file per stop, written atomically (a temporary file renamed over it), with the stop's
line and the cells not written. It lives outside the ledger's folder on purpose: that folder is
on the disk that failed. So is a stop of another kind (a node away, an interrupt) whose own
record found the ledger taking no write (``stops.record_stop`` marks it: ``owe``). ``status``
reads them (``found``), and the next round's command folds them into the ledger in the order
they stopped (``fold``: the cells written to their boots, the stop recorded as a
``round-stopped`` event, as any stop is) before it resumes, then removes each.

A kept stop names its ledger by a round the ledger holds (``mark``: its id and the instant it
started, the stop's round or the cluster's last), not by the ledger's path alone: a ledger
copied to a writable disk (as the read-only line says to) gets its stop, a new ledger put at
the old path does not (``Unrecorded.belongs``). A stop kept before any round of the cluster
began has no such round, and is the ledger's at its path.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from knobs.vocabulary import EventKind
from ledger import (
    CellRecordedAlready,
    Ledger,
    LedgerError,
    RoundRecord,
    UnwrittenCell,
    ledger_identity,
)
from ledger.redact import Redactor
from orchestrator.errors import OrchestrateError
from orchestrator.timestamps import utc_minute

T = TypeVar("T")

#: The folder's name in ``~/.cache/orchestrate``.
FOLDER = "unrecorded"


@dataclass(frozen=True)
class StopRecord:
    """A stop's record as ``stops.record_stop`` writes it (``round-stopped``): its round (None:
    before a round began), exit code, line (redacted) and detail (the error, the node)."""

    round_id: int | None
    exit_code: int
    line: str
    detail: dict[str, Any] = field(default_factory=dict)


#: The attribute of a stop (an exception) whose own record the ledger took no write of.
_OWED = "_orchestrate_unrecorded_stop"


def owe(stop: BaseException, record: StopRecord | None) -> None:
    """``stop``'s own ``record`` not written, the ledger taking no write (None: written after
    all): ``kept_on_stop`` keeps it outside the ledger as the command ends."""
    setattr(stop, _OWED, record)


def owed(stop: BaseException) -> StopRecord | None:
    """The record ``stop`` owes the ledger (``owe``), if any."""
    record = getattr(stop, _OWED, None)
    return record if isinstance(record, StopRecord) else None


@dataclass(frozen=True)
class Unrecorded:
    """A round's stop its ledger could not hold, and the cells it measured and could not
    write, as kept in ``path``; ``mark``: the round that names its ledger (``belongs``)."""

    path: Path
    ledger: str
    cluster: str
    round_id: int | None
    stopped_at: datetime
    exit_code: int
    line: str
    cells: list[UnwrittenCell] = field(default_factory=list)
    mark: tuple[int, datetime] | None = None
    detail: dict[str, Any] = field(default_factory=dict)

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

    def belongs(self, url: str, rounds: list[RoundRecord]) -> bool:
        """Whether this stop is the ledger's at ``url``, whose rounds of the cluster are
        ``rounds``: it holds the round that marks it (its id, started at the same instant),
        wherever its file is now; a stop with no such mark (kept before any round began, or by
        an older release), where its ledger is at the path it was kept for."""
        if self.mark is None:
            return ledger_identity(url) == self.ledger
        number, started = self.mark
        return any(
            r.id == number and r.cluster == self.cluster and _same_instant(r.started_at, started)
            for r in rounds
        )

    def elsewhere(self) -> str:
        """This stop, kept for a ledger once at this path that is not the one there now."""
        assert self.mark is not None
        return (
            f"a stop kept in {self.path} (at {utc_minute(self.stopped_at)}) is another "
            f"ledger's: the ledger once at this path had round {self.mark[0]} start at "
            f"{self.mark[1].isoformat()}, this one has not; it is not written here (point "
            "ORCHESTRATE_LEDGER at that ledger to write it, or delete the file)"
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
    round, the cells measured whose writes failed, still to be written, and the earlier
    commands' stops still to be folded into the ledger (``unheld``, oldest first). ``keeps``:
    whether such a stop is kept at all: once the ledger opened, or, before, where it is a
    server this machine reached before (waited for, as a timer's night:
    ``outages.waiting_for_ledger``); a URL never reached, or a SQLite file that does not open,
    is refused to the person who typed it. ``ledger``, ``mark``: the ledger opened, and the
    cluster's last round in it then (``opened``), what names it in a stop kept."""

    url: str
    cluster: str
    round_id: int | None = None
    cells: list[UnwrittenCell] = field(default_factory=list)
    unheld: list[Unrecorded] = field(default_factory=list)
    keeps: bool = False
    ledger: Ledger | None = None
    mark: tuple[int, datetime] | None = None

    def opened(self, ledger: Ledger) -> None:
        """``ledger`` opened: its last round of the cluster, if any, names it (``keep``).

        Raises:
            LedgerError: the ledger did not answer.
        """
        self.ledger = ledger
        rounds = ledger.rounds(self.cluster)
        self.mark = (rounds[-1].id, rounds[-1].started_at) if rounds else None

    def resuming(self, unheld: list[Unrecorded]) -> None:
        """The earlier commands' stops kept (``found``), to fold before the round: those of
        the ledger the round opens (``Unrecorded.belongs``)."""
        self.unheld = list(unheld)

    def attempt(self, ledger: Ledger, run: Callable[[], T], note: Callable[[str], None]) -> T:
        """``run()`` (the round, resumed from the ledger), after the earlier commands' stops
        are folded into the ledger in order (``fold``, each said with ``note``) and the cells
        an earlier try measured and could not write are written; the cells a ``LedgerError``
        says it could not write are taken from it, kept here for the next try, or for
        ``keep``."""
        try:
            if self.unheld:
                rounds = ledger.rounds(self.cluster)
                for kept in list(self.unheld):
                    if kept.belongs(ledger.url, rounds):
                        note(kept.recorded(fold(ledger, kept)))
                    elif kept.ledger == ledger_identity(ledger.url):
                        note(kept.elsewhere())
                    self.unheld.remove(kept)
            self.write_cells(ledger)
            return run()
        except LedgerError as e:
            self.cells.extend(c for c in e.unwritten if c not in self.cells)
            e.unwritten.clear()
            raise

    def write_cells(self, ledger: Ledger) -> int:
        """The cells still to be written, written (``_write``); how many were.

        Raises:
            LedgerError: the ledger took no write; the cells not written are kept here.
        """
        return _write(ledger, self.cells)


def _write(ledger: Ledger, cells: list[UnwrittenCell]) -> int:
    """``cells``, written in order and taken from the list (one already in the ledger is
    dropped); how many were.

    Raises:
        LedgerError: the ledger took no write; the cells not written stay in ``cells``.
    """
    written = 0
    while cells:
        c = cells[0]
        try:
            ledger.add_cell_result(
                c.experiment_id, c.boot_id, c.result, spec=c.spec, repeat=c.repeat
            )
            written += 1
        except CellRecordedAlready:
            pass
        except LedgerError as e:
            e.unwritten.clear()  # this one is kept already
            raise
        cells.pop(0)
    return written


@contextmanager
def kept_on_stop(url: str, cluster: str) -> Iterator[Stopping]:
    """The block of a round's command; a ``LedgerError`` that ends it, the ledger taking no
    write (``held_by_ledger``), is kept (``keep``) with the round and the cells not written
    before it goes on up, and its line says where; so is a stop of another kind whose own
    record the ledger took no write of (``owed``)."""
    stopping = Stopping(url, cluster)
    try:
        yield stopping
    except (OrchestrateError, KeyboardInterrupt) as e:
        if not stopping.keeps:
            raise
        if isinstance(e, LedgerError):
            if not held_by_ledger(e):
                raise
            stopping.cells.extend(c for c in e.unwritten if c not in stopping.cells)
            e.unwritten.clear()
            record = StopRecord(
                stopping.round_id,
                e.exit_code,
                Redactor.from_environment().text(e.message),
                {"error": "LedgerError"},
            )
        elif (owes := owed(e)) is not None:
            record = owes
        else:
            raise
        try:
            path = keep(stopping, record)
        except (OSError, RuntimeError) as failed:  # RuntimeError: no home folder
            said = f"this stop could not be kept for `status` either ({failed})"
        else:
            said = f"this stop is kept in {path} for `status` and the next round"
        if isinstance(e, OrchestrateError):
            e.message += (
                f"; {said}" if isinstance(e, LedgerError) else f"; its ledger took no write: {said}"
            )
        else:
            print(f"the ledger took no record of this interrupt: {said}", file=sys.stderr)
        raise


def keep(stopping: Stopping, record: StopRecord) -> Path:
    """The stop ``record`` of ``stopping``'s round, and its cells not written, written
    atomically to a file of its own that ``found`` reads; its path.

    Raises:
        OSError: the cache folder cannot be written.
    """
    now = datetime.now(UTC)
    folder = _folder()
    folder.mkdir(parents=True, exist_ok=True)
    mark = _mark(stopping)
    body = {
        "ledger": ledger_identity(stopping.url),
        "cluster": stopping.cluster,
        "round": record.round_id,
        "stopped_at": now.isoformat(),
        "exit_code": record.exit_code,
        "line": record.line,
        "detail": record.detail,
        "mark": None if mark is None else {"round": mark[0], "started_at": mark[1].isoformat()},
        "cells": [c.model_dump(mode="json") for c in stopping.cells],
    }
    name = f"{_prefix(stopping.url, stopping.cluster)}-{now:%Y%m%dT%H%M%S%fZ}-{os.getpid()}"
    fd, temporary = tempfile.mkstemp(prefix=f".{name}.", dir=folder)
    path = folder / f"{name}.json"
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
    stopping.cells.clear()  # in the file now: the next command writes them
    return path


def found(url: str, cluster: str) -> list[Unrecorded]:
    """The stops kept for ``cluster`` (``keep``), oldest first, that may be the ledger's at
    ``url``: those kept for that path, and those that name their ledger by a round wherever it
    is (``Unrecorded.belongs`` tells, once the ledger is read). A file that cannot be read is
    none (it is a note for the morning, never the record)."""
    try:
        files = sorted(_folder().glob("*.json"))
    except (OSError, RuntimeError):
        return []
    here = ledger_identity(url)
    kept = [k for k in map(_read, files) if k is not None and k.cluster == cluster]
    return sorted(
        (k for k in kept if k.ledger == here or k.mark is not None),
        key=lambda k: (k.stopped_at, k.path.name),
    )


def _read(path: Path) -> Unrecorded | None:
    try:
        body = json.loads(path.read_text(encoding="utf-8"))
        mark = body.get("mark")
        return Unrecorded(
            path=path,
            ledger=str(body["ledger"]),
            cluster=str(body["cluster"]),
            round_id=None if body["round"] is None else int(body["round"]),
            stopped_at=datetime.fromisoformat(body["stopped_at"]),
            exit_code=int(body["exit_code"]),
            line=str(body["line"]),
            cells=[UnwrittenCell.model_validate(c) for c in body["cells"]],
            mark=None
            if mark is None
            else (int(mark["round"]), datetime.fromisoformat(mark["started_at"])),
            detail=dict(body.get("detail") or {"error": "LedgerError"}),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def fold(ledger: Ledger, kept: Unrecorded) -> int:
    """The stop ``kept`` recorded in the ledger as any stop is (``round-stopped``, its time
    the stop's), after its cells are written; its file then removed; how many cells were
    written.

    Raises:
        LedgerError: the ledger still takes no write: the file stays.
    """
    written = _write(ledger, list(kept.cells))
    ledger.add_event(
        kept.cluster,
        EventKind.ROUND_STOPPED,
        subject="" if kept.round_id is None else str(kept.round_id),
        detail={
            **kept.detail,
            "exit_code": kept.exit_code,
            "stopped_at": kept.stopped_at.isoformat(),
            "recorded_late": True,
        },
        reason=kept.line,
    )
    with suppress(FileNotFoundError):
        kept.path.unlink()
    return written


def _mark(stopping: Stopping) -> tuple[int, datetime] | None:
    """The round that names ``stopping``'s ledger in a stop kept: the stop's own round, read
    now where the ledger still answers reads, else the cluster's last as the ledger opened."""
    ledger, number = stopping.ledger, stopping.round_id
    if ledger is not None and number is not None and (stopping.mark or (None,))[0] != number:
        with suppress(LedgerError):
            rnd = ledger.round(number)
            return rnd.id, rnd.started_at
    return stopping.mark


def _same_instant(a: datetime, b: datetime) -> bool:
    """Whether ``a`` and ``b`` are one instant (a naive time read back is UTC's)."""
    return a.replace(tzinfo=a.tzinfo or UTC) == b.replace(tzinfo=b.tzinfo or UTC)


def _cell_words(c: UnwrittenCell) -> str:
    return f"{c.result.cell} of experiment #{c.experiment_id}, boot {c.boot_id}"


def _folder() -> Path:
    """Where stops are kept (``RuntimeError``: no home folder)."""
    if folder := os.environ.get("ORCHESTRATE_CACHE"):
        return Path(folder) / FOLDER
    return Path.home() / ".cache" / "orchestrate" / FOLDER


def _prefix(url: str, cluster: str) -> str:
    """The start of the name of ``cluster``'s kept stops in the ledger at ``url``: the cluster
    and a digest of the ledger's path (a SQLite file's absolute path, a server's database:
    ``ledger_identity``) and the cluster."""
    digest = hashlib.sha256(f"{ledger_identity(url)}\n{cluster}".encode()).hexdigest()[:16]
    return f"{re.sub(r'[^A-Za-z0-9_.-]', '_', cluster)}-{digest}"
