"""Whether MLflow keeps up with the ledger, and what a write to it does when it does not.

The ledger is the round's record; MLflow is its mirror for people (``orchestrator.runlog``).
MLflow that stops answering mid-round (a tracking server restarted, its database away) is the
infrastructure's fault and never the night's end: the round goes on with the ledger as its
record and says so once; MLflow is tried again at each experiment once ``retry_s`` has passed
and, when it answers, filled in from the ledger (``RunLog.reconcile``). What MLflow missed
meanwhile that only MLflow keeps (the launcher texts and engine logs of those boots) is held in
the ledger until MLflow takes it (``Ledger.hold_texts``). The command's start still needs
MLflow (a person is watching then); a resume inside it, after a ledger outage was waited out,
does not; and a round closes only with its mirror complete (``RunLog.complete_round``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from ledger import MlflowSinkError

#: Seconds between tries of an MLflow that stopped answering (each try of a tracking server
#: still away is one request of 10 s: ``ledger.mlflow_uri.AWAY``).
RETRY_S = 600.0

T = TypeVar("T")


class Mirror:
    """MLflow's state against the ledger: up to date, or behind since a write failed."""

    def __init__(
        self,
        *,
        note: Callable[[str], None] = lambda _line: None,
        clock: Callable[[], float] = time.monotonic,
        retry_s: float = RETRY_S,
    ) -> None:
        self._note = note
        self._clock = clock
        self._retry_s = retry_s
        #: why MLflow is behind the ledger (None: it is not)
        self.behind: MlflowSinkError | None = None
        self._retry_at = 0.0
        self._strict = False

    def write(self, fn: Callable[[], T]) -> T | None:
        """``fn()``, a write to MLflow; while MLflow is behind, or when this write finds it
        gone, nothing (the ledger holds it; ``catch_up`` fills it in). Inside ``strictly``,
        MLflow's failure is raised."""
        return self._try(fn)[1]

    def took(self, fn: Callable[[], object]) -> bool:
        """Whether MLflow took ``fn()``, a write to it (as ``write``)."""
        return self._try(fn)[0]

    def _try(self, fn: Callable[[], T]) -> tuple[bool, T | None]:
        if self._strict:
            return True, fn()
        if self.behind is not None:
            return False, None
        try:
            return True, fn()
        except MlflowSinkError as e:
            self.behind = e
            self._retry_at = self._clock() + self._retry_s
            # a server away is waited for; a write it refused (a read-only or full artifact
            # store, a permission) waits on the person the line asks to fix it
            what, when = (
                ("stopped answering", "once it answers")
                if e.unreachable
                else ("refused a write", "once it takes one: fix what it names")
            )
            self._note(
                f"MLflow {what} ({e.message}); the round goes on with the ledger as its record, "
                f"and MLflow is filled in from it {when} (tried again every "
                f"{self._retry_s / 60:g} min, and when the round closes)"
            )
            return False, None

    @contextmanager
    def strictly(self) -> Iterator[None]:
        """Inside the block a failed write raises ``MlflowSinkError``."""
        strict, self._strict = self._strict, True
        try:
            yield
        finally:
            self._strict = strict

    def catch_up(self, fill: Callable[[], list[int]], round_id: int) -> bool:
        """Whether MLflow is up to date: while it is behind, once ``retry_s`` has passed,
        ``fill()`` it from the ledger (strictly: the experiments it completed) if it answers."""
        if self.behind is None:
            return True
        if self._clock() < self._retry_at:
            return False
        try:
            with self.strictly():
                repaired = fill()
        except MlflowSinkError:
            self._retry_at = self._clock() + self._retry_s
            return False
        self.behind = None
        self._note(
            f"MLflow answers again: {len(repaired)} experiment(s) of round {round_id} filled "
            "in from the ledger"
        )
        return True
