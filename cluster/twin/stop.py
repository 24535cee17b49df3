"""A twin engine's stop: SIGTERM or SIGINT sets a flag every wait of the engine polls, and a
rank lost from the group (``fatal``) stops it the same way; an engine that shut down cleanly
on a signal then dies of it, as vLLM's server does.

It owns how a signal reaches the engine's waits (polled, so the engine exits in well under a
second) and the exit that signal leaves behind.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from types import FrameType


class Stop:
    """SIGTERM / SIGINT → a flag every wait polls (the engine exits in well under a second)."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.fatal: str | None = None
        #: the signal that stopped the engine, if one did
        self.signum: int | None = None

    def install(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.signum = self.signum or signum
        self.event.set()

    def die_of_signal(self) -> None:
        """After a clean shutdown on a signal, die of it (as uvicorn, and so vLLM's server,
        re-raises the signals it captured once it has shut down): whoever waits on the engine
        sees it killed by that signal, not exited 0."""
        if self.signum is None:
            return
        sys.stdout.flush()
        sys.stderr.flush()
        signal.signal(self.signum, signal.SIG_DFL)
        signal.raise_signal(self.signum)

    def is_set(self) -> bool:
        return self.event.is_set() or self.fatal is not None

    def sleep(self, seconds: float) -> bool:
        """Wait ``seconds``; ``False`` when stopped (or failed) meanwhile."""
        deadline = time.monotonic() + seconds
        while not self.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return True
            self.event.wait(min(left, 0.05))
        return False
