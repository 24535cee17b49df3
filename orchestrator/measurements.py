"""An experiment's measurements, read from the ledger: its boots grouped by measurement index,
each with the cells recorded under it.

A measurement is one boot, or a boot and its continuation after an interruption (a resumed
round benches only the cells it lacks). It is *complete* when it has every cell of the
profile, and *trusted* when it is complete and every node's clocks were right while it ran:
only a trusted measurement may set a level or feed a noise estimate.

A reading counts for a cell only where the definition it was measured under is the cell's as
the profile defines it now (``counts``): a cell whose concurrency, context, length or timing
changed since — between a killed round and its resume, or between two rounds — is measured
again, and its readings of the old definition stay in the ledger, set aside, never pooled with
the new ones nor compared with them (a cell the profile no longer has counts for nothing). So a
champion measured under the old definition has no level under the new one until it is booted
again (``policy.next_action``), and ``changed_cells`` says once at a round's start which cells
are measured again and why.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from knobs.records import CellResultRecord, CellSpec
from knobs.vocabulary import BootStatus, Status
from ledger import BootRecord, CellReading, ExperimentRecord, Ledger, VerdictRecord
from orchestrator.verdict import slow_ranks


@dataclass
class Measurement:
    """The cells of one measurement of an experiment (one boot, or a boot and its
    continuation after an interruption)."""

    index: int
    role: str
    cells: list[CellResultRecord]
    complete: bool = False
    #: each boot's rendering (``BootRecord.rendering``) and start, in boot order
    boots: list[tuple[str | None, datetime]] = field(default_factory=list)

    def trusted(self, min_matmul_rate: float) -> bool:
        """Complete, and every node's clocks were right: what a level or a noise estimate may
        rest on."""
        return self.complete and not slow_ranks(self.cells, min_matmul_rate)


@dataclass(frozen=True)
class BootCount:
    """The boots an experiment took, from its boot rows: how many, and how those that failed
    failed (each class and how many boots failed with it); and the measurements its verdict
    weighed. The two differ, and both are said, each by its name: a boot is what the cluster
    paid (its time is its GPU-hours), a measurement what the verdict judged. A measurement
    interrupted mid-cells and finished on a new boot (a resume measures only the cells it
    lacks) is two boots and one measurement; a boot that failed, or whose nodes' clocks were
    off, is a boot with no measurement. Every count of an experiment's boots (its decided line,
    the report, MLflow, ``status``) is this one."""

    boots: int
    failed: Mapping[str, int]
    #: the measurements the verdict weighed (its ``candidate_boots``, the name a verdict has
    #: recorded them under since the first release), else those its boots made: one for each
    #: measurement index with a boot that did not fail
    measurements: int = 0

    @classmethod
    def of(
        cls, e: ExperimentRecord, boots: Sequence[BootRecord], verdict: VerdictRecord | None = None
    ) -> BootCount:
        """``e``'s boots (``boots``: its rows) up to its verdict, every one of them while it
        is undecided: a failed boot counts as a boot, and a champion's later re-measurements
        are other verdicts' boots, not its. ``verdict``: ``e``'s, whose statistics say how many
        measurements it weighed (a crash's and a veto's weighed none)."""
        mine = [b for b in boots if e.decided_at is None or b.started_at <= e.decided_at]
        failed = Counter(
            b.failure_class or "unknown" for b in mine if b.status == BootStatus.FAILED
        )
        weighed = None if verdict is None else verdict.stats.get("candidate_boots")
        if isinstance(weighed, int) and not isinstance(weighed, bool):
            measurements = weighed
        elif verdict is not None and verdict.status in (Status.CRASH, Status.VETOED):
            measurements = 0
        else:  # a boot that failed, or never came up (killed as it booted), measured nothing
            measurements = len(
                {b.measurement for b in mine if b.status in (BootStatus.UP, BootStatus.DOWN)}
            )
        return cls(len(mine), dict(sorted(failed.items())), measurements)

    @property
    def failures(self) -> int:
        """How many of the boots failed."""
        return sum(self.failed.values())

    @property
    def said(self) -> bool:
        """Whether a decided line says the count: a boot failed, or the boots paid are not the
        measurements weighed (a measurement resumed on a new boot, a boot set aside for a
        node's clocks). A crash's or a veto's none weighed, with no boot failed, is its
        reason's to say."""
        return bool(self.failed) or 0 < self.measurements != self.boots

    def words(self) -> str:
        """``2 boot(s) paid for 1 measurement(s), failed: unreachable ×1``, as a person reads
        it (the report's ``boots`` and ``measurements`` columns)."""
        failed = ", ".join(f"{cls} ×{n}" for cls, n in self.failed.items())
        paid = f"{self.boots} boot(s) paid for {self.measurements} measurement(s)"
        return paid + (f", failed: {failed}" if failed else "")


#: what a reading recorded before schema 7 says of the definition it was measured under
_RECORDED = ("category", "concurrency", "context_tokens")


def counts(cell: CellSpec, reading: CellReading) -> bool:
    """Whether ``reading`` measured ``cell`` as the profile defines it now: the same name (or
    the one it was renamed from), and the definition it was measured under is ``cell``'s. A
    reading recorded before the ledger kept definitions (schema 7) is judged on what it
    recorded of it: category, concurrency and context."""
    if reading.result.cell not in (cell.name, cell.renamed_from):
        return False
    if reading.spec is not None:
        return cell.same_definition(reading.spec)
    return all(getattr(reading.result, f) == getattr(cell, f) for f in _RECORDED)


def changed_cells(ledger: Ledger, cluster: str, cells: Sequence[CellSpec]) -> dict[str, str]:
    """A line for each of ``cells`` whose latest reading on ``cluster`` was measured under
    another definition, by the cell's name: what changed, and that it is measured again (its
    old readings kept, set aside). Once it is measured as it is now, nothing is said of it
    again. A round says them as it starts, and ``status`` too."""
    latest: dict[str, CellReading] = {}
    # the newest by its boot (boots are numbered as they start), not the last in experiment
    # order: the champion's re-measurements are filed under its own experiment, often the
    # ledger's first; an experiment's readings of one boot come in recording order
    for readings in ledger.cluster_cell_results(cluster).values():
        for r in readings:
            last = latest.get(r.result.cell)
            if last is None or r.boot_id >= last.boot_id:
                latest[r.result.cell] = r
    lines: dict[str, str] = {}
    for cell in cells:
        mine = [latest[n] for n in (cell.name, cell.renamed_from) if n in latest]
        last = max(mine, key=lambda r: r.boot_id, default=None)
        if last is None or counts(cell, last):
            continue
        was = last.spec.model_dump() if last.spec is not None else last.result.model_dump()
        lines[cell.name] = (
            f"cell {cell.name} changed since it was last measured ({cell_diff(was, cell)}): its "
            "readings of the "
            "old definition stay in the ledger, set aside, and it is measured again (the "
            "champion too, before a change is judged against it)"
        )
    return lines


def cell_diff(was: Mapping[str, object], cell: CellSpec) -> str:
    """What ``cell`` changed of a definition it had (``was``: a ``CellSpec``'s fields, or
    what a reading recorded of them), in words: ``concurrency 1 → 4, warmup_s 1.0 → 0.5``."""
    now = cell.model_dump(exclude={"name"})
    return ", ".join(f"{k} {was[k]} → {v}" for k, v in now.items() if k in was and was[k] != v)


def read_measurements(
    ledger: Ledger, experiment_id: int, cells: Sequence[CellSpec]
) -> list[Measurement]:
    """The experiment's measurements in index order; ``cells``: the profile's, which complete
    one (``counts``: the readings of another definition are left out)."""
    return _assembled(ledger.boots(experiment_id), ledger.cell_results(experiment_id), cells)


def read_cluster_measurements(
    ledger: Ledger, cluster: str, cells: Sequence[CellSpec]
) -> dict[int, list[Measurement]]:
    """``read_measurements`` of every experiment of ``cluster`` that has boots, by experiment,
    in two queries (not two an experiment: a noise model reads them all at each step)."""
    readings = ledger.cluster_cell_results(cluster)
    return {
        e: _assembled(boots, readings.get(e, []), cells)
        for e, boots in ledger.cluster_boots(cluster).items()
    }


def clocks_off_in_a_row(
    ledger: Ledger,
    cluster: str,
    since: datetime,
    cells: Sequence[CellSpec],
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
            read[experiment] = {m.index: m for m in read_measurements(ledger, experiment, cells)}
        m = read[experiment].get(index)
        if m is None or not m.complete:
            continue
        slow = slow_ranks(m.cells, min_matmul_rate)
        if not slow:
            break
        out.append((experiment, slow))
    return out


def clocks_off_counts(
    ledger: Ledger, cluster: str, cells: Sequence[CellSpec], min_matmul_rate: float
) -> tuple[int, dict[int, int]]:
    """The cluster's complete measurements, and how many of them ran with each node's clocks
    off (by rank)."""
    every = read_cluster_measurements(ledger, cluster, cells).values()
    complete = [m for ms in every for m in ms if m.complete]
    off: dict[int, int] = {}
    for m in complete:
        for rank in slow_ranks(m.cells, min_matmul_rate):
            off[rank] = off.get(rank, 0) + 1
    return len(complete), off


def _assembled(
    boots: Sequence[BootRecord], readings: Sequence[CellReading], cells: Sequence[CellSpec]
) -> list[Measurement]:
    defined = {c.name: c for c in cells}
    # a cell renamed: its readings under the old name are its own, under its name now
    renamed = {c.renamed_from: c for c in cells if c.renamed_from is not None}
    by_boot: dict[int, list[CellResultRecord]] = {}
    for r in readings:
        cell = defined.get(r.result.cell) or renamed.get(r.result.cell)
        if cell is not None and counts(cell, r):
            result = r.result
            if result.cell != cell.name:  # renamed since
                result = result.model_copy(update={"cell": cell.name})
            by_boot.setdefault(r.boot_id, []).append(result)
    out: dict[int, Measurement] = {}
    for boot in boots:
        m = out.setdefault(boot.measurement, Measurement(boot.measurement, boot.role, []))
        m.cells.extend(by_boot.get(boot.id, []))
        m.boots.append((boot.rendering, boot.started_at))
    need = set(defined)
    for m in out.values():
        m.complete = need <= {c.cell for c in m.cells}
    return [out[k] for k in sorted(out)]
