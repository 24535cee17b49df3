"""Boots, the cells they measured, the champion's drift, and the record's events."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from knobs.config import Config
from knobs.records import CellResultRecord, CellSpec
from knobs.vocabulary import BootRole, BootStatus, EventKind, FailureClass
from ledger.base import LedgerBase
from ledger.errors import CellRecordedAlready, LedgerError
from ledger.models import BootRow, CellResultRow, DriftRow, EventRow, ExperimentRow, utcnow
from ledger.records import BootRecord, CellReading, DriftRecord, EventRecord, UnwrittenCell
from ledger.rows import boot_record, current_champion, drift_record, event_record

T = TypeVar("T")
_Row = TypeVar("_Row", BootRow, CellResultRow)


class Measures(LedgerBase):
    """Boots, the cells they measured, the champion's drift, and the record's events."""

    # ---- boots and cells ------------------------------------------------------------------
    def start_boot(
        self,
        experiment_id: int,
        config: Config,
        *,
        role: BootRole = BootRole.MEASURE,
        measurement: int | None = None,
        rendering: str | None = None,
    ) -> BootRecord:
        """Record that a boot of ``config`` begins (stop-all is its first step).

        ``measurement`` continues an interrupted measurement; by default the boot starts the
        experiment's next one. ``rendering``: a digest of the launchers it renders.
        """
        with self._session() as s:
            if measurement is None:
                last = s.scalars(
                    select(BootRow.measurement)
                    .where(BootRow.experiment_id == experiment_id)
                    .order_by(BootRow.measurement.desc())
                ).first()
                measurement = 0 if last is None else last + 1
            row = BootRow(
                experiment_id=experiment_id,
                config_key=config.key,
                role=str(role),
                measurement=measurement,
                status=str(BootStatus.BOOTING),
                rendering=rendering,
            )
            s.add(row)
            s.flush()
            return boot_record(row)

    def end_boot(
        self,
        boot_id: int,
        *,
        status: BootStatus,
        failure_class: FailureClass | None = None,
        failure_detail: str | None = None,
        rank: int | None = None,
        host: str | None = None,
        if_open: bool = False,
    ) -> bool:
        """Mark a boot ``up`` (healthy), ``failed`` or ``down`` (torn down after use); a
        failed one with the node its error named (``rank``, ``host``), if it named one. With
        ``if_open``, a boot already ended is left as it is (whoever ended it first, said so):
        whether it was marked."""
        with self._session() as s:
            row = self._get(s, BootRow, boot_id)
            if if_open and row.status not in (str(BootStatus.BOOTING), str(BootStatus.UP)):
                return False
            row.status = str(status)
            if status == BootStatus.UP:
                row.healthy_at = utcnow()
            else:
                row.ended_at = utcnow()
            row.failure_class = failure_class or row.failure_class
            row.failure_detail = failure_detail or row.failure_detail
            row.failed_rank = rank if rank is not None else row.failed_rank
            row.failed_host = host or row.failed_host
        return True

    def boots(self, experiment_id: int) -> list[BootRecord]:
        """The boots of an experiment, oldest first."""
        with self._session() as s:
            rows = s.scalars(
                select(BootRow).where(BootRow.experiment_id == experiment_id).order_by(BootRow.id)
            )
            return [boot_record(r) for r in rows]

    def cluster_boots(self, cluster: str) -> dict[int, list[BootRecord]]:
        """The boots of every experiment of ``cluster``, by experiment, each oldest first (one
        query: ``boots`` of each)."""
        return self._by_experiment(BootRow, cluster, boot_record)

    def open_boots(self, cluster: str | None = None) -> list[BootRecord]:
        """Boots never marked down or failed: servers that may still run (of ``cluster``'s
        experiments only, when one is named)."""
        with self._session() as s:
            query = select(BootRow).where(
                BootRow.status.in_((str(BootStatus.BOOTING), str(BootStatus.UP)))
            )
            if cluster is not None:
                query = query.join(ExperimentRow, ExperimentRow.id == BootRow.experiment_id).where(
                    ExperimentRow.cluster == cluster
                )
            return [boot_record(r) for r in s.scalars(query)]

    def add_cell_result(
        self,
        experiment_id: int,
        boot_id: int,
        result: CellResultRecord,
        *,
        spec: CellSpec,
        repeat: int = 0,
    ) -> None:
        """Record one measured cell and the definition (``spec``) it was measured under.

        Raises:
            CellRecordedAlready: that cell of that boot and repeat is already recorded.
            LedgerError: the ledger did not take the write; the cell is in its ``unwritten``.
        """
        try:
            with self._session() as s:
                s.add(
                    CellResultRow(
                        experiment_id=experiment_id,
                        boot_id=boot_id,
                        cell=result.cell,
                        repeat=repeat,
                        output_throughput=result.output_throughput,
                        accepted_per_step=result.accepted_per_step,
                        p90_ttft_ms=result.p90_ttft_ms,
                        errors=result.errors,
                        record=result.model_dump(mode="json"),
                        spec=spec.model_dump(mode="json"),
                    )
                )
        except LedgerError as e:
            if isinstance(e.__cause__, IntegrityError):
                raise CellRecordedAlready(e.message, url=e.url) from e
            # a measurement is what a night pays GPU time for: what stops the round carries it
            e.unwritten.append(
                UnwrittenCell(
                    experiment_id=experiment_id,
                    boot_id=boot_id,
                    repeat=repeat,
                    result=result,
                    spec=spec,
                )
            )
            raise

    def cell_results(self, experiment_id: int) -> list[CellReading]:
        """Every cell an experiment's boots measured, in recording order."""
        with self._session() as s:
            rows = s.scalars(
                select(CellResultRow)
                .where(CellResultRow.experiment_id == experiment_id)
                .order_by(CellResultRow.id)
            )
            return [_reading(r) for r in rows]

    def cluster_cell_results(self, cluster: str) -> dict[int, list[CellReading]]:
        """``cell_results`` of every experiment of ``cluster``, by experiment (one query)."""
        return self._by_experiment(CellResultRow, cluster, _reading)

    def _by_experiment(
        self, table: type[_Row], cluster: str, record: Callable[[_Row], T]
    ) -> dict[int, list[T]]:
        """Every row of ``table`` whose experiment is ``cluster``'s, as ``record``, by
        experiment, in the order they were written."""
        out: dict[int, list[T]] = {}
        with self._session() as s:
            rows = s.scalars(
                select(table)
                .join(ExperimentRow, ExperimentRow.id == table.experiment_id)
                .where(ExperimentRow.cluster == cluster)
                .order_by(table.id)
            )
            for r in rows:
                out.setdefault(r.experiment_id, []).append(record(r))
        return out

    def set_champion_objective(self, cluster: str, objective: float) -> None:
        """The champion's best estimate changed (a re-measurement)."""
        with self._session() as s:
            row = current_champion(s, cluster)
            if row is not None:
                row.objective = objective

    def add_drift(
        self,
        *,
        cluster: str,
        experiment_id: int,
        measurement: int,
        before: float,
        after: float,
        significant: bool,
    ) -> DriftRecord:
        """Record a champion re-measurement and its drift."""
        with self._session() as s:
            row = DriftRow(
                cluster=cluster,
                experiment_id=experiment_id,
                measurement=measurement,
                before=before,
                after=after,
                drift_pct=(after / before - 1.0) * 100.0 if before > 0 else 0.0,
                significant=significant,
            )
            s.add(row)
            s.flush()
            return drift_record(row)

    def drifts(self, cluster: str) -> list[DriftRecord]:
        """Every drift record of the cluster, oldest first."""
        with self._session() as s:
            rows = s.scalars(
                select(DriftRow).where(DriftRow.cluster == cluster).order_by(DriftRow.id)
            )
            return [drift_record(r) for r in rows]

    # ---- events ---------------------------------------------------------------------------
    def add_event(
        self,
        cluster: str,
        kind: EventKind,
        *,
        subject: str = "",
        detail: dict[str, object] | None = None,
        reason: str = "",
        actor: str = "",
    ) -> EventRecord:
        """Record something done to the record outside a verdict (see ``EventRow``)."""
        with self._session() as s:
            row = EventRow(
                cluster=cluster,
                kind=str(kind),
                subject=subject,
                detail=dict(detail or {}),
                reason=reason,
                actor=actor,
            )
            s.add(row)
            s.flush()
            return event_record(row)

    def events(self, cluster: str, kind: EventKind | None = None) -> list[EventRecord]:
        """The cluster's events (of ``kind``, if given), oldest first."""
        with self._session() as s:
            query = select(EventRow).where(EventRow.cluster == cluster)
            if kind is not None:
                query = query.where(EventRow.kind == str(kind))
            return [event_record(r) for r in s.scalars(query.order_by(EventRow.id))]


def _reading(row: CellResultRow) -> CellReading:
    return CellReading(
        row.boot_id,
        row.repeat,
        CellResultRecord.model_validate(row.record),
        None if row.spec is None else CellSpec.model_validate(row.spec),
    )
