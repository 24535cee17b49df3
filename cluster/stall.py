"""Whether the measuring client was kept off the CPU during a cell's window.

A bench cell counts the tokens that *arrive* in its window, so a client that is not scheduled
(a busy host, a VM's stolen time, a laptop's other work) reads the engine low: tokens the engine
sent at the window's end are read after it, and closed-loop streams are refilled late, leaving
the engine idle. That is the client's host's fault, never the config's, so a cell whose client
was stalled for more than ``DISTURBED_FRACTION`` of its window is measured again
(``cluster.bench.run_cell``) and the record says how long the kept one was stalled.

``StallWatch`` is a thread that sleeps to absolute deadlines ``TICK_S`` apart on the event
loop's clock (``time.monotonic``). A wake-up later than ``LATE_S`` means the process was off the
CPU for about that long: a busy asyncio loop or the GIL delays a wake-up by a few milliseconds,
not tens. Each late wake-up is a stalled interval ``[deadline, woke)``; one that overlaps the
window counts whole, as a stall across the window's start or end moves tokens across it.

The engine's host can stall too. An engine that counts its own late wake-ups
(``ENGINE_STALL_METRIC``, the twin's scheduler) has them added to the client's: from the cell's
first request to the window's end, since the counter says how long but not when.
"""

from __future__ import annotations

import threading
import time

from knobs.records import CellResultRecord

#: seconds between the watch's wake-ups
TICK_S = 0.01
#: a wake-up this much later than its deadline (seconds) is a stall, not the GIL's turn (the
#: interpreter switches threads every 5 ms)
LATE_S = 0.015
#: An engine may report its own host's stalls as this counter (seconds its scheduler woke late;
#: the twin does, vLLM does not): tokens due before a window's edge and sent after it move
#: across the edge as they do for a stalled client, so they count the same way
ENGINE_STALL_METRIC = "twin:scheduler_stall_seconds"
#: a window whose client was stalled for more than this fraction of it is measured again
DISTURBED_FRACTION = 0.02
#: … at most this many times in all (the least stalled measurement is kept)
ATTEMPTS = 3


class StallWatch:
    """Records the intervals in which its thread woke late; a context manager around a cell."""

    def __init__(self) -> None:
        self._stalls: list[tuple[float, float]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stall-watch", daemon=True)

    def __enter__(self) -> StallWatch:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        deadline = time.monotonic() + TICK_S
        while not self._stop.is_set():
            time.sleep(max(0.0, deadline - time.monotonic()))
            woke = time.monotonic()
            if woke - deadline > LATE_S:
                with self._lock:
                    self._stalls.append((deadline, woke))
                deadline = woke  # the next tick is measured from here, not owed from before
            deadline += TICK_S

    def stalled_s(self, start: float, end: float) -> float:
        """Seconds the client was stalled in stalls that overlap ``[start, end]``
        (``time.monotonic``), each counted whole: what a stall costs a window is at its edges
        (tokens sent before the window's start and read after it count in; tokens sent before
        its end and read after it count out), up to the stall's whole length."""
        with self._lock:
            stalls = list(self._stalls)
        return sum(b - a for a, b in stalls if b >= start and a <= end)


def disturbed(stalled_s: float, window_s: float) -> bool:
    """Whether a window of ``window_s`` seconds stalled for ``stalled_s`` is the host's reading."""
    return window_s > 0 and stalled_s > DISTURBED_FRACTION * window_s


def stalled(record: CellResultRecord) -> float:
    """Seconds the cell's window was disturbed by its hosts: the client's and the engine's."""
    return record.client_stall_s + record.engine_stall_s
