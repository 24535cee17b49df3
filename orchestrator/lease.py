"""The cluster lease: one orchestrator drives a cluster at a time; a killed one is replaced."""

from __future__ import annotations

import os
import socket
import threading
import uuid
from types import TracebackType

from ledger import LeaseRecord, Ledger, LedgerError


def _process_gone(lease: LeaseRecord) -> bool:
    """A lease is stale when its holder ran on this host and that process no longer exists."""
    if lease.hostname != socket.gethostname():
        return False
    try:
        os.kill(lease.pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


class ClusterLease:
    """Holds a cluster's lease while in a ``with`` block, renewing it in the background."""

    def __init__(self, ledger: Ledger, cluster: str, *, ttl_s: float = 120.0) -> None:
        self.ledger = ledger
        self.cluster = cluster
        self.ttl_s = ttl_s
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lost: LedgerError | None = None

    def __enter__(self) -> ClusterLease:
        """Take the lease.

        Raises:
            LeaseHeld: another live orchestrator holds it.
        """
        self.ledger.acquire_lease(
            self.cluster,
            holder=self.holder,
            hostname=socket.gethostname(),
            pid=os.getpid(),
            ttl_s=self.ttl_s,
            stale=_process_gone,
        )
        self._thread = threading.Thread(target=self._renew, name="lease", daemon=True)
        self._thread.start()
        return self

    def _renew(self) -> None:
        while not self._stop.wait(self.ttl_s / 3):
            try:
                self.ledger.renew_lease(self.cluster, holder=self.holder, ttl_s=self.ttl_s)
            except LedgerError as e:
                self.lost = e
                return

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        try:
            self.ledger.release_lease(self.cluster, holder=self.holder)
        except LedgerError:
            if exc is None:
                raise
