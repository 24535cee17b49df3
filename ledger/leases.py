"""The cluster's lease: one orchestrator at a time."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

from ledger.base import LedgerBase
from ledger.errors import LeaseHeld, LeaseLost
from ledger.fence import Fence
from ledger.models import LeaseRow, utcnow
from ledger.records import LeaseRecord
from ledger.rows import lease_record


class Leases(LedgerBase):
    """The cluster's lease: one orchestrator at a time."""

    # ---- leases ---------------------------------------------------------------------------
    def acquire_lease(
        self,
        cluster: str,
        *,
        holder: str,
        hostname: str,
        pid: int,
        ttl_s: float,
        stale: Callable[[LeaseRecord], bool],
    ) -> LeaseRecord:
        """Take the cluster's lease for ``holder``.

        A lease is taken over when it has expired, when ``holder`` already holds it, or when
        ``stale(lease)`` says its holder is gone (e.g. a killed process on this host).

        Raises:
            LeaseHeld: a live holder has it.
        """
        now = utcnow()
        with self._session(fenced=False) as s:
            row = s.get(LeaseRow, cluster, with_for_update=True)
            if row is not None:
                current = lease_record(row)
                alive = current.expires_at > now and current.holder != holder
                if alive and not stale(current):
                    raise LeaseHeld(
                        f"cluster {cluster} is leased to {current.holder} (pid {current.pid} on "
                        f"{current.hostname}) until {current.expires_at:%Y-%m-%d %H:%M:%S} UTC; "
                        "wait for it, or stop that orchestrator",
                        url=self.url,
                        lease=current,
                    )
                s.delete(row)
                s.flush()
            row = LeaseRow(
                cluster=cluster,
                holder=holder,
                hostname=hostname,
                pid=pid,
                acquired_at=now,
                heartbeat_at=now,
                expires_at=now + timedelta(seconds=ttl_s),
            )
            s.add(row)
            s.flush()
            return lease_record(row)

    def renew_lease(self, cluster: str, *, holder: str, ttl_s: float) -> None:
        """Extend ``holder``'s lease.

        Raises:
            LeaseLost: the lease is no longer held by ``holder``.
            LedgerError: the ledger did not answer.
        """
        now = utcnow()
        with self._session(fenced=False) as s:
            row = s.get(LeaseRow, cluster, with_for_update=True)
            if row is None or row.holder != holder:
                current = None if row is None else lease_record(row)
                fence = self._fence
                if fence is None or (fence.cluster, fence.holder) != (cluster, holder):
                    fence = Fence(cluster, holder)
                raise LeaseLost(fence.lost_line(current), url=self.url, lease=current)
            row.heartbeat_at = now
            row.expires_at = now + timedelta(seconds=ttl_s)

    def release_lease(self, cluster: str, *, holder: str) -> None:
        """Give the lease back if ``holder`` has it."""
        with self._session(fenced=False) as s:
            row = s.get(LeaseRow, cluster)
            if row is not None and row.holder == holder:
                s.delete(row)

    def lease(self, cluster: str) -> LeaseRecord | None:
        """The cluster's lease, if any."""
        with self._session(fenced=False) as s:
            row = s.get(LeaseRow, cluster)
            return None if row is None else lease_record(row)
