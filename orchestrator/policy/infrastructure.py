"""What the round does about the infrastructure's failures, never a verdict on a config: the
wait before a boot that failed for the infrastructure's reasons is taken again, and when the
round stops instead (``infrastructure_retry``); when a node's clocks, off measurement after
measurement, stop it (``clocks_off_stop``); which nodes' clocks are off more often than
chance explains, for ``status`` to name (``flaky_nodes``); how long a ledger or an MLflow
that does not answer is waited for (``LEDGER_WAITS``).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from orchestrator.profile_sections import VerdictSpec

#: Seconds the round waits for a ledger that does not answer before it resumes, wait after
#: wait (about half an hour in all; then it stops, exit 4, for the same command to resume);
#: the same schedule for an MLflow that does not answer as the round's command opens it.
LEDGER_WAITS = (10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 600.0)


#: The longest wait between two tries of a boot that failed for the infrastructure's reasons:
#: the doubling backoff stops here, so the default retries (``VerdictSpec.infra_retries``)
#: wait 30 s, 1, 2, 4, 8 and 10 min — a node's reboot, a switch's, a network's maintenance
#: window — before the round stops and the night with it.
INFRA_BACKOFF_MAX_S = 600.0
#: What a node's clocks are taken to stick at before this cluster's measurements say: 2 % of
#: its boots (the twin's landscapes), worth ``CLOCKS_OFF_PRIOR_WEIGHT`` measurements; the
#: ledger's own count takes over as it grows (``clocks_off_rate``).
CLOCKS_OFF_PRIOR = 0.02
CLOCKS_OFF_PRIOR_WEIGHT = 50
#: Measurements in a row with clocks off stop the round when the rate this cluster's clocks
#: stuck at before them would make such a run by chance less often than this: the power
#: cycles before each boot did not bring the node back (DOMAIN: only a power cycle fixes stuck
#: clocks), and every boot after would measure the node, not a config. A round of sixty boots
#: stops for nothing about once in 17,000 rounds.
CLOCKS_OFF_CHANCE = 1e-6
#: ... and never before this many in a row: one node at 2 % four times (1.6 in 10 million);
#: any of four such nodes (about one boot in 13) takes six.
CLOCKS_OFF_IN_A_ROW = 4


@dataclass(frozen=True)
class ClocksHistory:
    """The cluster's complete measurements before a run of clocks off (``measurements``), how
    many of them had each node's clocks off (``off``, by rank), and its nodes' ranks."""

    measurements: int
    off: Mapping[int, int]
    nodes: Collection[int]


def clocks_off_rate(history: ClocksHistory, rank: int) -> float:
    """How often node ``rank``'s clocks are off in a measurement, as far as the cluster's
    measurements say: its count over theirs, with ``CLOCKS_OFF_PRIOR`` as
    ``CLOCKS_OFF_PRIOR_WEIGHT`` measurements more."""
    prior = CLOCKS_OFF_PRIOR * CLOCKS_OFF_PRIOR_WEIGHT
    return (history.off.get(rank, 0) + prior) / (history.measurements + CLOCKS_OFF_PRIOR_WEIGHT)


def clocks_off_stop(
    off: Sequence[Collection[int]], history: ClocksHistory
) -> tuple[list[int], int] | None:
    """Whether clocks off stop the round, and if so the nodes to name and how many
    measurements in a row: ``off``, the nodes off in each of the cluster's latest measurements
    that ran with clocks off, newest first (``measurements.clocks_off_in_a_row``); ``history``,
    the cluster's measurements before them. One node off in each of the run's newest ``n``
    stops it when its rate (``clocks_off_rate``) to the ``n`` is under ``CLOCKS_OFF_CHANCE``;
    so does a run of any nodes off, at the chance that some node is off in a measurement. Never
    fewer than ``CLOCKS_OFF_IN_A_ROW``; shorter or likelier runs are chance, each boot set
    aside and taken again."""
    common = set(off[0]) if off else set()
    run = 0
    for nodes in off:
        if not common & set(nodes):
            break
        common &= set(nodes)
        run += 1
    chance = max((clocks_off_rate(history, r) for r in common), default=1.0) ** run
    if run >= CLOCKS_OFF_IN_A_ROW and chance < CLOCKS_OFF_CHANCE:
        return sorted(common), run
    seen = {r for nodes in off for r in nodes}
    healthy = math.prod(1.0 - clocks_off_rate(history, r) for r in {*history.nodes, *seen})
    if len(off) >= CLOCKS_OFF_IN_A_ROW and (1.0 - healthy) ** len(off) < CLOCKS_OFF_CHANCE:
        return sorted(seen), len(off)
    return None


#: A node is named as one whose clocks are off more often than the cluster's other nodes'
#: (``flaky_nodes``) when its count would come at their rate less often than this...
FLAKY_CHANCE = 1e-3
#: ... and never on fewer measurements with its clocks off than this.
FLAKY_MIN_OFF = 3


def flaky_nodes(history: ClocksHistory) -> dict[int, float]:
    """The nodes whose clocks were off in more of the cluster's measurements
    (``history``) than chance explains at the rate of its other nodes (pooled, with
    ``CLOCKS_OFF_PRIOR`` as ``CLOCKS_OFF_PRIOR_WEIGHT`` measurements more; on a cluster of one
    node, that prior alone): by rank, the chance of so many at that rate. Each of their
    measurements with clocks off was set aside and booted again: the node, not a config,
    costs those boots, and a power cycle or a service of the node is the remedy."""
    n = history.measurements
    prior = CLOCKS_OFF_PRIOR * CLOCKS_OFF_PRIOR_WEIGHT
    out: dict[int, float] = {}
    for rank in sorted({*history.nodes, *history.off}):
        k = history.off.get(rank, 0)
        if k < FLAKY_MIN_OFF:
            continue
        others = [r for r in {*history.nodes, *history.off} if r != rank]
        rate = (sum(history.off.get(r, 0) for r in others) + prior) / (
            n * len(others) + CLOCKS_OFF_PRIOR_WEIGHT
        )
        chance = _at_least(k, n, rate)
        if chance < FLAKY_CHANCE:
            out[rank] = chance
    return out


def _at_least(k: int, n: int, p: float) -> float:
    """P(X ≥ k) for X ~ Binomial(n, p), summed in logs (no overflow at thousands)."""
    if k <= 0:
        return 1.0
    if p <= 0.0:
        return 0.0
    if p >= 1.0:
        return 1.0
    logs = [
        math.lgamma(n + 1)
        - math.lgamma(i + 1)
        - math.lgamma(n - i + 1)
        + i * math.log(p)
        + (n - i) * math.log1p(-p)
        for i in range(k, n + 1)
    ]
    top = max(logs)
    return min(1.0, math.exp(top) * sum(math.exp(v - top) for v in logs))


def infrastructure_retry(spec: VerdictSpec, failures: int) -> float | None:
    """After a boot failed for the infrastructure's reasons (``INFRASTRUCTURE``): the seconds
    to wait before taking it again, or ``None`` when the retries are spent and the round stops
    (exit 5, the experiment left undecided for the same command to resume). ``failures``: the
    experiment's infrastructure failures in a row, this one included. Such a failure is never a
    verdict on the config."""
    if failures > spec.infra_retries:
        return None
    return min(INFRA_BACKOFF_MAX_S, spec.infra_backoff_s * 2.0 ** (failures - 1))
