"""GPU-hours: what a cluster owner counts. The wall time of every boot of a round (from its
launch to its teardown: the boot itself, its gates, its cells; a failed boot and a champion's
re-measurement included) times the GPUs the profile's nodes declare (``NodeSpec.gpus``).

A boot still open counts to now; a boot a killed run left open counts to when the resume
closed it (its engines held their GPUs all the while).
"""

from __future__ import annotations

from datetime import UTC, datetime

from ledger import Ledger, RoundRecord
from orchestrator.profile import Profile


def cluster_gpus(profile: Profile) -> int:
    """The GPUs of the profile's cluster: every node's ``gpus``, summed."""
    return sum(node.gpus for node in profile.cluster.nodes)


def boot_hours(ledger: Ledger, rnd: RoundRecord, now: datetime | None = None) -> float:
    """The wall-clock hours of ``rnd``'s boots, summed (each boot on all its nodes at once)."""
    now = now or datetime.now(UTC)
    end_of_round = rnd.finished_at or now
    seconds = 0.0
    for boot in ledger.boots_since(rnd.cluster, rnd.started_at):
        if boot.started_at > end_of_round:
            break  # a later round's
        ended = boot.ended_at or end_of_round
        seconds += max(0.0, (ended - boot.started_at).total_seconds())
    return seconds / 3600.0


def gpu_hours(
    ledger: Ledger, rnd: RoundRecord, profile: Profile, now: datetime | None = None
) -> float:
    """``rnd``'s GPU-hours so far (see the module)."""
    return boot_hours(ledger, rnd, now) * cluster_gpus(profile)
