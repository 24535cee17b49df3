"""The wall-clock bound of an LLM proposal's wait on the API (``api_deadline_s``).

The SDK's ``timeout`` bounds each silence on the socket, not a request: a server that
accepts and never answers costs ``api_timeout_s`` per attempt, retries included, and one that
trickles a byte now and then, or a ``retry-after`` of an hour, is never cut. So a call runs
on a worker thread and the proposal waits for it at most what is left of its deadline; past
that the call is abandoned and the client closed under it (its socket closed, later retries
refused), so the abandoned worker ends too: at the socket's next byte, or its next silence of
``api_timeout_s``, whichever comes first."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class DeadlinePassed(Exception):
    """The call did not finish in the time left (internal: the conversation turns it into a
    fallback reason; it never leaves ``agents``)."""


class Deadline:
    """``seconds`` from now."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._until = time.monotonic() + seconds

    def left(self) -> float:
        """Seconds left (0 once passed)."""
        return max(0.0, self._until - time.monotonic())

    def run(self, call: Callable[[], T], *, abandon: Callable[[], None]) -> T:
        """``call()``'s value (or its exception), waiting at most the time left.

        Raises:
            DeadlinePassed: the deadline passed first; ``abandon`` has run (it must make the
                call end soon: close what it reads from).
        """
        left = self.left()
        if left <= 0:
            raise DeadlinePassed
        worker = _Worker(call)
        # a daemon thread, not an executor's: an abandoned call never holds up the exit
        threading.Thread(target=worker.work, name="llm-api-call", daemon=True).start()
        if not worker.done.wait(left):
            abandon()
            raise DeadlinePassed
        if worker.error is not None:
            raise worker.error
        return worker.value  # type: ignore[return-value]  # set when there is no error


class _Worker(Generic[T]):
    def __init__(self, call: Callable[[], T]) -> None:
        self.call = call
        self.done = threading.Event()
        self.value: T | None = None
        self.error: BaseException | None = None

    def work(self) -> None:
        try:
            self.value = self.call()
        except BaseException as e:  # handed to the waiting thread, which raises it
            self.error = e
        finally:
            self.done.set()
