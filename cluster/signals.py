"""Signals held while something must not be cut in the middle, and a coroutine run in an
event loop of its own that a signal never leaves half-built or half-closed.

A Ctrl-C (or the SIGTERM and SIGHUP a command raises as one, ``orchestrator.interrupts``)
lands between any two bytecodes. Landing inside asyncio's loop constructor it left a loop
without its self-pipe, whose finaliser printed a traceback on the way out
(``'_UnixSelectorEventLoop' object has no attribute '_ssock'``) beside a coroutine "never
awaited": a person who pressed Ctrl-C once during a cell read both under the round's last
line. ``held`` is the one way a signal is held here: the loop's construction and its close
(``run_whole``), and the teardown that may not be cut short (``interrupts.unbroken``).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections.abc import Callable, Coroutine, Iterator
from types import FrameType
from typing import Any, TypeVar

T = TypeVar("T")

#: The signals that end a command, in the order ``held`` delivers those it held.
ENDING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def held(on_hold: Callable[[int, list[int]], None] | None = None) -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP that arrive in the block are held until it ends, then
    delivered as they came, once each (the first one's handler raises where the block ends,
    which ends the rest). ``on_hold(signum, held_so_far)`` is called as each arrives. Only a
    signal that would have interrupted the command is held (its handler is Python's): one
    ignored stays ignored, one left to its default keeps it. Off the main thread (where no
    signal is handled) nothing is held."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: list[int] = []

    def hold(signum: int, _frame: FrameType | None) -> None:
        if on_hold is not None:
            on_hold(signum, list(arrived))
        arrived.append(signum)

    previous = {s: signal.getsignal(s) for s in ENDING}
    interrupting = [s for s, handler in previous.items() if callable(handler)]
    try:
        for s in interrupting:
            signal.signal(s, hold)
        yield
    finally:
        for s in interrupting:
            signal.signal(s, previous[s])
        for signum in sorted(set(arrived), key=arrived.index):
            signal.raise_signal(signum)  # its handler raises here (the first one's ends the rest)


class _WholeLoop(asyncio.SelectorEventLoop):
    """asyncio's loop, closed whole: a signal during ``close`` is delivered after it."""

    def close(self) -> None:
        with held():
            super().close()


def _whole_loop() -> asyncio.AbstractEventLoop:
    with held():  # built whole: a signal in the constructor is delivered after it
        return _WholeLoop()


def run_whole(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """``asyncio.run(make())``, in a loop of its own that a signal never leaves half-built
    or half-closed, and with the coroutine closed if a signal comes before it is awaited.
    While the coroutine runs, a Ctrl-C cancels it (asyncio's own handling) and
    ``KeyboardInterrupt`` is raised once it has unwound."""
    with asyncio.Runner(loop_factory=_whole_loop) as runner:
        coroutine: Coroutine[Any, Any, T] | None = None
        try:
            coroutine = make()
            return runner.run(coroutine)
        finally:
            if coroutine is not None:
                coroutine.close()  # run, nothing; never awaited (a signal first), no warning
