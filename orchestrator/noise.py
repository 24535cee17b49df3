"""The noise model of a cluster: how much one boot's objective and one cell repeat scatter.

Seeded from the profile (``verdict.noise``) and learned from the ledger: every config measured
on several boots (the champion's re-measurements, candidates' repeats and confirmations) adds
degrees of freedom to the boot-to-boot estimate; repeats of a cell within a boot add to the
run-to-run estimate. The prior counts as ``prior_weight`` degrees of freedom, so a handful of
boots cannot talk the model into an implausibly quiet cluster.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class NoiseModel:
    """Relative standard deviations (log scale) of a boot's objective and of a cell repeat."""

    boot_cv: float
    run_cv: float
    boot_dof: int
    run_dof: int

    def se(self, n_candidate: int, n_champion: int) -> float:
        """Standard error of the log ratio of two means of per-boot objectives."""
        return self.boot_cv * math.sqrt(1.0 / max(1, n_candidate) + 1.0 / max(1, n_champion))


def pooled(groups: Sequence[Sequence[float]]) -> tuple[float, int]:
    """Sum of squared deviations of ``log(x)`` from each group's mean, and its degrees of
    freedom, over groups of positive values (groups of one add nothing)."""
    ss = 0.0
    dof = 0
    for group in groups:
        logs = [math.log(x) for x in group if x > 0]
        if len(logs) < 2:
            continue
        mean = sum(logs) / len(logs)
        ss += sum((v - mean) ** 2 for v in logs)
        dof += len(logs) - 1
    return ss, dof


def learn(
    *,
    prior_boot_cv: float,
    prior_run_cv: float,
    prior_weight: float,
    boot_groups: Sequence[Sequence[float]],
    run_groups: Sequence[Sequence[float]],
) -> NoiseModel:
    """The posterior noise model: the prior's variance weighted by ``prior_weight`` degrees of
    freedom, pooled with the ledger's.

    ``boot_groups``: per config, its per-boot objectives. ``run_groups``: per (boot, cell), the
    throughputs of its repeats.
    """
    boot_ss, boot_dof = pooled(boot_groups)
    run_ss, run_dof = pooled(run_groups)
    boot_var = (prior_weight * prior_boot_cv**2 + boot_ss) / (prior_weight + boot_dof)
    run_var = (prior_weight * prior_run_cv**2 + run_ss) / (prior_weight + run_dof)
    return NoiseModel(
        boot_cv=math.sqrt(boot_var), run_cv=math.sqrt(run_var), boot_dof=boot_dof, run_dof=run_dof
    )
