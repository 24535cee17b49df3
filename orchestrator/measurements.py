"""An experiment's measurements, read from the ledger: its boots grouped by measurement index,
each with the cells recorded under it.

A measurement is one boot, or a boot and its continuation after an interruption (a resumed
round benches only the cells it lacks). It is *complete* when it has every cell of the
profile, and *trusted* when it is complete and every node's clocks were right while it ran:
only a trusted measurement may set a level or feed a noise estimate.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime

from knobs.records import CellResultRecord
from ledger import BootRecord, Ledger
from orchestrator.verdict import slow_ranks


@dataclass
class Measurement:
    """The cells of one measurement of an experiment (one boot, or a boot and its
    continuation after an interruption)."""

    index: int
    role: str
    cells: list[CellResultRecord]
    complete: bool = False

    def trusted(self, min_matmul_rate: float) -> bool:
        """Complete, and every node's clocks were right: what a level or a noise estimate may
        rest on."""
        return self.complete and not slow_ranks(self.cells, min_matmul_rate)


def read_measurements(
    ledger: Ledger, experiment_id: int, wanted: Collection[str]
) -> list[Measurement]:
    """The experiment's measurements in index order; ``wanted``: the cells that complete one."""
    return _assembled(ledger.boots(experiment_id), ledger.cell_results(experiment_id), wanted)


def read_cluster_measurements(
    ledger: Ledger, cluster: str, wanted: Collection[str]
) -> dict[int, list[Measurement]]:
    """``read_measurements`` of every experiment of ``cluster`` that has boots, by experiment,
    in two queries (not two an experiment: a noise model reads them all at each step)."""
    cells = ledger.cluster_cell_results(cluster)
    return {
        e: _assembled(boots, cells.get(e, []), wanted)
        for e, boots in ledger.cluster_boots(cluster).items()
    }


def clocks_off_in_a_row(
    ledger: Ledger,
    cluster: str,
    since: datetime,
    wanted: Collection[str],
    min_matmul_rate: float,
) -> list[tuple[int, list[int]]]:
    """The cluster's latest complete measurements since ``since`` (whatever experiment they
    measured) that ran with a node's clocks off, newest first, back to the latest one whose
    clocks were right: ``(experiment, the nodes off)`` each. A failed boot or an unfinished
    measurement neither counts nor ends the run. Reads only the experiments it walks back
    through."""
    last_boot: dict[tuple[int, int], int] = {}
    for boot in ledger.boots_since(cluster, since):
        last_boot[(boot.experiment_id, boot.measurement)] = boot.id
    read: dict[int, dict[int, Measurement]] = {}
    out: list[tuple[int, list[int]]] = []
    for experiment, index in sorted(last_boot, key=last_boot.__getitem__, reverse=True):
        if experiment not in read:
            read[experiment] = {m.index: m for m in read_measurements(ledger, experiment, wanted)}
        m = read[experiment].get(index)
        if m is None or not m.complete:
            continue
        slow = slow_ranks(m.cells, min_matmul_rate)
        if not slow:
            break
        out.append((experiment, slow))
    return out


def clocks_off_counts(
    ledger: Ledger, cluster: str, wanted: Collection[str], min_matmul_rate: float
) -> tuple[int, dict[int, int]]:
    """The cluster's complete measurements, and how many of them ran with each node's clocks
    off (by rank)."""
    every = read_cluster_measurements(ledger, cluster, wanted).values()
    complete = [m for ms in every for m in ms if m.complete]
    off: dict[int, int] = {}
    for m in complete:
        for rank in slow_ranks(m.cells, min_matmul_rate):
            off[rank] = off.get(rank, 0) + 1
    return len(complete), off


def _assembled(
    boots: Sequence[BootRecord],
    cells: Sequence[tuple[int, int, CellResultRecord]],
    wanted: Collection[str],
) -> list[Measurement]:
    by_boot: dict[int, list[CellResultRecord]] = {}
    for boot_id, _repeat, record in cells:
        by_boot.setdefault(boot_id, []).append(record)
    out: dict[int, Measurement] = {}
    for boot in boots:
        m = out.setdefault(boot.measurement, Measurement(boot.measurement, boot.role, []))
        m.cells.extend(by_boot.get(boot.id, []))
    need = set(wanted)
    for m in out.values():
        m.complete = need <= {c.cell for c in m.cells}
    return [out[k] for k in sorted(out)]
