"""A cell's cutoff: the event that stops a bench cell where it stands, handed in by whoever
runs it (``orchestrator.lease``: the lease's renewal sets it when the ledger says the cluster is
another orchestrator's now). A process suspended mid-cell and woken after another took the
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
    """``work``'s result; cancelled (its streams closed by its own ``finally``) within
    ``POLL_S`` of ``stop`` being set.

    Raises:
        OwnershipLost: ``stop`` was set before ``work`` ended.
    """
    task = asyncio.ensure_future(work)
    if stop is None:
        return await task
    while not task.done():
        if stop.is_set():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            check(stop, cell)
        await asyncio.wait({task}, timeout=POLL_S)
    return task.result()
