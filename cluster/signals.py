"""Signals held while something must not be cut in the middle, and a coroutine run in an
event loop of its own that a signal never leaves half-built or half-closed.

A Ctrl-C (or the SIGTERM and SIGHUP a command raises as one, ``orchestrator.interrupts``)
lands between any two bytecodes. Landing inside asyncio's loop constructor it left a loop
without its self-pipe, whose finaliser printed a traceback on the way out
(``'_UnixSelectorEventLoop' object has no attribute '_ssock'``) beside a coroutine "never
awaited": a person who pressed Ctrl-C once during a cell read both under the round's last
line. ``held`` is the one way a signal is held here: the loop's construction, the unwinding
of what it ran and its close (``run_whole``), and the teardown that may not be cut short
(``interrupts.unbroken``).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections.abc import Callable, Coroutine, Iterator
from inspect import CORO_CREATED, getcoroutinestate
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


def _whole_loop() -> asyncio.AbstractEventLoop:
    with held():  # built whole: a signal in the constructor is delivered after it
        return asyncio.new_event_loop()


def run_whole(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """``asyncio.run(make())``, in a loop of its own that a signal never leaves half-built
    or half-closed. While the coroutine runs, a Ctrl-C cancels it (asyncio's own handling),
    and a SIGTERM raises ``KeyboardInterrupt`` where it lands (``interrupts``); either way
    the coroutine is then cancelled and unwinds (its streams closed) and the loop is closed
    with the signals held, so that a second signal cannot cut that short: it is delivered
    once they are done. A coroutine that a signal kept from starting is closed unstarted
    (no "never awaited")."""
    runner = asyncio.Runner(loop_factory=_whole_loop)
    try:
        coroutine: Coroutine[Any, Any, T] | None = None
        try:
            coroutine = make()
            return runner.run(coroutine)
        finally:
            if coroutine is not None and getcoroutinestate(coroutine) == CORO_CREATED:
                coroutine.close()
    finally:
        with held():
            runner.close()  # cancels what still runs, lets it unwind, closes the loop
