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
