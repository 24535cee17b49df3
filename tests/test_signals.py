"""``cluster.signals.run_whole``: a Ctrl-C that lands while a cell's event loop is built,
closed, or running ends the cell with ``KeyboardInterrupt`` and nothing else: no traceback
from a half-built loop's finaliser, no coroutine "never awaited" (CI's
``test_teardown_signals[ctrl-c-twice]`` printed both, once, when the Ctrl-C came as the
cell's loop was made).

The signal is sent from inside asyncio's own steps (its loop's ``_make_self_pipe`` and
``_close_self_pipe``), where a person's Ctrl-C can land, by wrapping them: asyncio's code,
not ours, is what is wrapped."""

from __future__ import annotations

import asyncio
import gc
import signal
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event

from cluster.signals import held, run_whole
from knobs.vocabulary import EventKind
from ledger import Ledger
from orchestrator.interrupts import ended_like_ctrl_c

#: where the Ctrl-C lands: before the loop's self-pipe is made, or once it is closed and the
#: rest of the loop is not
STEPS = {
    "building": ("_make_self_pipe", "before"),
    "closing": ("_close_self_pipe", "after"),
}


@pytest.fixture
def ctrl_c_raises() -> Iterator[None]:
    """SIGINT as a command has it: Python's own handler, raising ``KeyboardInterrupt``."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _ctrl_c_at(monkeypatch: pytest.MonkeyPatch, step: str, when: str) -> None:
    """A Ctrl-C the first time asyncio's loop reaches ``step``, ``before`` or ``after`` it."""
    base = asyncio.selector_events.BaseSelectorEventLoop
    original: Callable[[Any], None] = getattr(base, step)
    sent: list[str] = []

    def ctrl_c(self: Any) -> None:
        if when == "after":
            original(self)
        if not sent:
            sent.append(step)
            signal.raise_signal(signal.SIGINT)
        if when == "before":
            original(self)

    monkeypatch.setattr(base, step, ctrl_c)


def _the_aftermath(
    monkeypatch: pytest.MonkeyPatch, run: Callable[[], object]
) -> tuple[list[str], list[str]]:
    """``run``'s KeyboardInterrupt expected; what the interpreter then printed of it: the
    exceptions ignored in finalisers, and the warnings (a coroutine never awaited)."""
    ignored: list[str] = []

    def unraisable(u: Any) -> None:
        ignored.append(f"{type(u.exc_value).__name__}: {u.exc_value}")

    monkeypatch.setattr(sys, "unraisablehook", unraisable)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(KeyboardInterrupt):
            run()
        gc.collect()
    said = [str(w.message) for w in caught if not issubclass(w.category, ResourceWarning)]
    return ignored, said


@pytest.mark.parametrize("when", sorted(STEPS))
def test_a_ctrl_c_while_the_loop_is_built_or_closed_ends_it_with_nothing_printed(
    monkeypatch: pytest.MonkeyPatch, ctrl_c_raises: None, when: str
) -> None:
    ran: list[str] = []

    async def cell() -> str:
        ran.append("cell")
        return "measured"

    _ctrl_c_at(monkeypatch, *STEPS[when])
    ignored, said = _the_aftermath(monkeypatch, lambda: run_whole(cell))
    assert ignored == []
    assert said == []
    # built whole, the cell ran before the Ctrl-C ended it; not built, it never started
    assert ran == (["cell"] if when == "closing" else [])


def test_a_ctrl_c_while_the_cell_runs_cancels_it_and_its_cleanup_runs(
    monkeypatch: pytest.MonkeyPatch, ctrl_c_raises: None
) -> None:
    cleaned: list[str] = []

    async def cell() -> None:
        try:
            loop = asyncio.get_running_loop()
            loop.call_soon(signal.raise_signal, signal.SIGINT)
            await asyncio.sleep(3600)
        finally:
            cleaned.append("streams closed")

    ignored, said = _the_aftermath(monkeypatch, lambda: run_whole(cell))
    assert (ignored, said, cleaned) == ([], [], ["streams closed"])


def test_the_loop_runs_the_cell_and_leaves_the_handlers_as_they_were(ctrl_c_raises: None) -> None:
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}

    async def cell() -> int:
        await asyncio.sleep(0)
        return 7

    assert run_whole(cell) == 7
    assert {s: signal.getsignal(s) for s in before} == before


def test_held_delivers_each_signal_once_when_the_block_ends(ctrl_c_raises: None) -> None:
    arrivals: list[tuple[int, list[int]]] = []
    with pytest.raises(KeyboardInterrupt), held(lambda s, before: arrivals.append((s, before))):
        signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGINT)
        arrivals.append((0, []))  # still in the block: nothing raised yet
    assert arrivals == [(signal.SIGINT, []), (signal.SIGINT, [signal.SIGINT]), (0, [])]


def test_a_second_sigterm_while_the_cell_unwinds_is_held_until_it_has(
    monkeypatch: pytest.MonkeyPatch, ctrl_c_raises: None
) -> None:
    """SIGTERM as a round has it (``ended_like_ctrl_c``: ``KeyboardInterrupt`` raised where it
    lands, not asyncio's cancelling Ctrl-C), sent twice: the second while the cell closes its
    streams. The reviewer's `kill -TERM; sleep 0.3; kill -TERM` printed "coroutine ignored
    GeneratorExit" and the ledger blamed "an error of orchestrate's"."""
    cleaned: list[str] = []

    async def cell() -> None:
        try:
            asyncio.get_running_loop().call_soon(signal.raise_signal, signal.SIGTERM)
            await asyncio.sleep(3600)
        finally:
            signal.raise_signal(signal.SIGTERM)  # the second, as the streams close
            await asyncio.sleep(0)
            cleaned.append("streams closed")

    with ended_like_ctrl_c():
        ignored, said = _the_aftermath(monkeypatch, lambda: run_whole(cell))
    assert (ignored, said, cleaned) == ([], [], ["streams closed"])


def test_a_ctrl_c_inside_a_ledger_commit_is_delivered_once_the_commit_ends(
    ctrl_c_raises: None, tmp_path: Path
) -> None:
    """A SIGTERM (as Ctrl-C) that landed inside SQLAlchemy's commit left the session half-way:
    once its rollback was refused (a traceback, exit 1 in place of 130), once its SQLite write
    lock held, so that the round's stop, recorded next, waited 30 s for the lock and was lost
    (CI's ``test_report`` interrupted round, its page without its stop). The signal is sent
    from inside SQLAlchemy's commit (its ``commit`` event): the commit ends whole, the
    interrupt is raised after it, and the next write, from another connection, is not kept
    waiting."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    with Ledger(url) as ledger:
        sent: list[int] = []

        def interrupt(_connection: object) -> None:
            if not sent:
                sent.append(signal.SIGINT)
                signal.raise_signal(signal.SIGINT)

        event.listen(ledger._engine, "commit", interrupt)
        with pytest.raises(KeyboardInterrupt):
            ledger.add_event("c", EventKind.ROUND_STOPPED, subject="1", reason="first")
        assert sent, "no signal was sent: the test tested nothing"
        event.remove(ledger._engine, "commit", interrupt)
        with Ledger(url) as other:
            started = time.monotonic()
            other.add_event("c", EventKind.ROUND_STOPPED, subject="1", reason="second")
            waited = time.monotonic() - started
        assert waited < 10, f"the next write waited {waited:.0f}s on a lock the first one held"
        ledger.add_event("c", EventKind.ROUND_STOPPED, subject="1", reason="third")
        said = [e.reason for e in ledger.events("c", EventKind.ROUND_STOPPED)]
    assert said == ["first", "second", "third"]
