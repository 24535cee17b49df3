"""What the round does about the infrastructure's failures, never a verdict on a config: the
wait before a boot that failed for the infrastructure's reasons is taken again, and when the
round stops instead (``infrastructure_retry``); when a node's clocks, off measurement after
measurement, stop it (``clocks_off_stop``); how long a ledger or an MLflow that does not answer
is waited for (``LEDGER_WAITS``).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from orchestrator.profile import VerdictSpec

#: Seconds the round waits for a ledger that does not answer before it resumes, wait after
#: wait (about half an hour in all; then it stops, exit 4, for the same command to resume);
#: the same schedule for an MLflow that does not answer as the round's command opens it.
LEDGER_WAITS = (10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 600.0)


#: The longest wait between two tries of a boot that failed for the infrastructure's reasons:
#: the doubling backoff stops here, so the default retries (``VerdictSpec.infra_retries``)
#: wait 30 s, 1, 2, 4, 8 and 10 min — a node's reboot, a switch's, a network's maintenance
#: window — before the round stops and the night with it.
INFRA_BACKOFF_MAX_S = 600.0
#: The cluster's measurements in a row (whatever config they measured) with one node's clocks
#: off in each that stop the round: the power cycles before each boot did not bring the node
#: back (DOMAIN: only a power cycle fixes stuck clocks), and every boot after would measure the
#: node, not a config. A node whose clocks stick at 2 % of its boots by chance (the twin's
#: landscapes) does it four times in a row once in 6 million boots (a cluster of four such
#: nodes: once in 1.5 million); a boot of that cluster has some node off about once in 13, so
#: three in a row of any node would stop about three rounds of sixty boots in a hundred.
CLOCKS_OFF_IN_A_ROW = 4
#: The cluster's measurements in a row with some node's clocks off, whichever, that stop the
#: round (nodes taking turns: no measurement left to judge a config on).
CLOCKS_OFF_ANY_IN_A_ROW = 8


def clocks_off_stop(off: Sequence[Collection[int]]) -> tuple[list[int], int] | None:
    """Whether clocks off stop the round, and if so the nodes to name and how many
    measurements in a row: ``off``, the nodes off in each of the cluster's latest measurements
    that ran with clocks off, newest first (``measurements.clocks_off_in_a_row``). One node off
    in each of ``CLOCKS_OFF_IN_A_ROW`` stops it, as do ``CLOCKS_OFF_ANY_IN_A_ROW`` with any
    node off; fewer are chance, each boot set aside and taken again."""
    common = set(off[0]) if off else set()
    run = 0
    for nodes in off:
        if not common & set(nodes):
            break
        common &= set(nodes)
        run += 1
    if run >= CLOCKS_OFF_IN_A_ROW:
        return sorted(common), run
    if len(off) >= CLOCKS_OFF_ANY_IN_A_ROW:
        return sorted({r for nodes in off for r in nodes}), len(off)
    return None


def infrastructure_retry(spec: VerdictSpec, failures: int) -> float | None:
    """After a boot failed for the infrastructure's reasons (``INFRASTRUCTURE``): the seconds
    to wait before taking it again, or ``None`` when the retries are spent and the round stops
    (exit 5, the experiment left undecided for the same command to resume). ``failures``: the
    experiment's infrastructure failures in a row, this one included. Such a failure is never a
    verdict on the config."""
    if failures > spec.infra_retries:
        return None
    return min(INFRA_BACKOFF_MAX_S, spec.infra_backoff_s * 2.0 ** (failures - 1))
