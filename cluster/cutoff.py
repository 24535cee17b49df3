"""A cell's cutoff: the event that stops a bench cell where it stands, handed in by whoever
runs it (``orchestrator.lease``: the lease's renewal sets it when the ledger says the cluster is
another orchestrator's now, and the node claims' renewal when a node's claim is another's or
gone, ``cluster.claims``). A process suspended mid-cell and woken after another took the
cluster over must not go on loading the new owner's engines (its requests lowered that one's
readings by about a tenth): the cell sends no request more once the event is set, and its
streams are closed within ``POLL_S``. ``cluster`` imports nothing of the orchestrator's: the
event is all it is given."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from cluster.errors import OwnershipLost

T = TypeVar("T")

#: How often a running cell looks at its cutoff (seconds): its streams close within this.
POLL_S = 0.05


def check(stop: threading.Event | None, cell: str) -> None:
    """Nothing while ``stop`` is unset (or none).

    Raises:
        OwnershipLost: it is set: the cell must send nothing more.
    """
    if stop is not None and stop.is_set():
        raise OwnershipLost(
            f"cell {cell} stopped: the cluster is no longer this orchestrator's to measure"
        )


async def unless_stopped(
    stop: threading.Event | None, cell: str, work: Coroutine[Any, Any, T]
) -> T:
    """``work``'s result, awaited in this task; cancelled (its streams closed by its own
    ``finally``) within ``POLL_S`` of ``stop`` being set. The event is looked at by a timer's
    callback, not by a task of its own: an interrupt that lands in it (Ctrl-C, SIGTERM) leaves
    no task behind with an exception nobody retrieves.

    Raises:
        OwnershipLost: ``stop`` was set before ``work`` ended.
    """
    if stop is None:
        return await work
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None  # called from a coroutine
    stopped = False
    timer: asyncio.TimerHandle | None = None

    def look() -> None:
        nonlocal stopped, timer
        if stop.is_set():
            stopped = True
            task.cancel()
        else:
            timer = loop.call_later(POLL_S, look)

    look()
    try:
        return await work
    except asyncio.CancelledError:
        if not stopped:
            raise
        task.uncancel()
        check(stop, cell)
        raise  # not reached: ``stop`` is set
    finally:
        if timer is not None:
            timer.cancel()
