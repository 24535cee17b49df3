"""Texts held for MLflow: a boot's launchers and engine logs that MLflow did not take when they
were written (it was away, ``orchestrator.mirror``), kept until it takes them.

The ledger holds the verdicts, cells and metrics for good; these texts only until MLflow has
them: they are large (an engine log is read up to 2 MB a node) and MLflow is their home. They
are redacted as MLflow would have them before they are stored (no secret reaches the ledger),
and compressed.
"""

from __future__ import annotations

import zlib
from collections.abc import Collection, Mapping

from sqlalchemy import delete, select

from ledger.base import LedgerBase
from ledger.models import ExperimentRow, HeldTextRow
from ledger.records import HeldText
from ledger.redact import Redactor


class HeldTexts(LedgerBase):
    """The texts an experiment's MLflow run still lacks."""

    def hold_texts(self, experiment_id: int, texts: Mapping[str, str]) -> None:
        """Hold ``texts`` (artifact path → text) for ``experiment_id``'s run, redacted; one
        held already at the same path is replaced, as MLflow overwrites an artifact."""
        if not texts:
            return
        redactor = Redactor.from_environment()
        with self._session() as s:
            s.execute(
                delete(HeldTextRow).where(
                    HeldTextRow.experiment_id == experiment_id, HeldTextRow.path.in_(list(texts))
                )
            )
            s.add_all(
                HeldTextRow(
                    experiment_id=experiment_id,
                    path=path,
                    body=zlib.compress(redactor.value(path, text).encode("utf-8")),
                )
                for path, text in texts.items()
            )

    def holding(self, cluster: str) -> list[int]:
        """The experiments of ``cluster`` with texts held, oldest first."""
        with self._session() as s:
            ids = s.scalars(
                select(HeldTextRow.experiment_id)
                .join(ExperimentRow, ExperimentRow.id == HeldTextRow.experiment_id)
                .where(ExperimentRow.cluster == cluster)
                .distinct()
            )
            return sorted(ids)

    def held_texts(self, experiment_id: int) -> list[HeldText]:
        """The texts held for ``experiment_id``'s run, in the order they were held."""
        with self._session() as s:
            rows = s.scalars(
                select(HeldTextRow)
                .where(HeldTextRow.experiment_id == experiment_id)
                .order_by(HeldTextRow.id)
            )
            return [
                HeldText(
                    id=r.id,
                    experiment_id=r.experiment_id,
                    path=r.path,
                    text=zlib.decompress(r.body).decode("utf-8"),
                )
                for r in rows
            ]

    def release_texts(self, ids: Collection[int]) -> None:
        """Forget the held texts ``ids``: MLflow has them."""
        with self._session() as s:
            s.execute(delete(HeldTextRow).where(HeldTextRow.id.in_(list(ids))))
