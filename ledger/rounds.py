"""Rounds and the proposals made in them."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from knobs.spec import Value
from knobs.vocabulary import ProposalStatus, RoundStatus
from ledger.base import LedgerBase
from ledger.errors import NotInLedger
from ledger.models import BootRow, ExperimentRow, ProposalRow, RoundRow, utcnow
from ledger.records import BootRecord, ProposalRecord, RoundRecord
from ledger.redact import Redactor
from ledger.rows import boot_record, proposal_record, round_record


class Rounds(LedgerBase):
    """Rounds and the proposals made in them."""

    # ---- rounds ---------------------------------------------------------------------------
    def create_round(
        self,
        *,
        cluster: str,
        profile_name: str,
        profile_digest: str,
        budget: int,
        proposer: str,
        approve: str,
        seed: int,
        max_hours: float | None = None,
        max_gpu_hours: float | None = None,
    ) -> RoundRecord:
        """Start a new round (``max_hours``: its wall-clock cap, ``max_gpu_hours``: its
        GPU-hours cap; both kept for its resumes)."""
        with self._session() as s:
            row = RoundRow(
                cluster=cluster,
                profile_name=profile_name,
                profile_digest=profile_digest,
                budget=budget,
                proposer=proposer,
                approve=approve,
                seed=seed,
                status=str(RoundStatus.RUNNING),
                max_hours=max_hours,
                max_gpu_hours=max_gpu_hours,
            )
            s.add(row)
            s.flush()
            return round_record(row)

    def unfinished_round(self, cluster: str) -> RoundRecord | None:
        """The cluster's round that was started and never finished (a killed run), if any."""
        with self._session() as s:
            row = s.scalars(
                select(RoundRow)
                .where(RoundRow.cluster == cluster, RoundRow.status == str(RoundStatus.RUNNING))
                .order_by(RoundRow.id.desc())
            ).first()
            return None if row is None else round_record(row)

    def round(self, round_id: int) -> RoundRecord:
        """Round ``round_id``.

        Raises:
            NotInLedger: no such round.
        """
        with self._session() as s:
            return round_record(self._get(s, RoundRow, round_id))

    def rounds(self, cluster: str) -> list[RoundRecord]:
        """Every round of ``cluster``, oldest first."""
        with self._session() as s:
            rows = s.scalars(
                select(RoundRow).where(RoundRow.cluster == cluster).order_by(RoundRow.id)
            )
            return [round_record(r) for r in rows]

    def clusters(self) -> list[str]:
        """Every cluster that has had a round here, by name."""
        with self._session() as s:
            return sorted(s.scalars(select(RoundRow.cluster).distinct()))

    def set_round_mlflow(self, round_id: int, run_id: str) -> None:
        """Remember the round's MLflow parent run."""
        with self._session() as s:
            self._get(s, RoundRow, round_id).mlflow_run_id = run_id

    def set_round_max_hours(self, round_id: int, max_hours: float | None) -> None:
        """Keep the wall-clock cap a resume was given, for the resumes after it."""
        with self._session() as s:
            self._get(s, RoundRow, round_id).max_hours = max_hours

    def set_round_max_gpu_hours(self, round_id: int, max_gpu_hours: float | None) -> None:
        """Keep the GPU-hours cap a resume was given, for the resumes after it."""
        with self._session() as s:
            self._get(s, RoundRow, round_id).max_gpu_hours = max_gpu_hours

    def boots_since(self, cluster: str, since: datetime) -> list[BootRecord]:
        """Every boot of ``cluster`` started at or after ``since`` (whichever experiment it
        measured: a champion re-measured in a round is booted under its own), oldest first."""
        with self._session() as s:
            rows = s.scalars(
                select(BootRow)
                .join(ExperimentRow, BootRow.experiment_id == ExperimentRow.id)
                .where(ExperimentRow.cluster == cluster, BootRow.started_at >= since)
                .order_by(BootRow.id)
            )
            return [boot_record(r) for r in rows]

    def finish_round(self, round_id: int, status: RoundStatus = RoundStatus.DONE) -> None:
        """Close a round (done, or failed when it could not go on)."""
        with self._session() as s:
            row = self._get(s, RoundRow, round_id)
            row.status = str(status)
            row.finished_at = utcnow()

    # ---- proposals ------------------------------------------------------------------------
    def add_proposal(
        self,
        *,
        round_id: int,
        source: str,
        knob: str,
        old_value: Value,
        new_value: Value,
        champion_key: str,
        hypothesis: str = "",
        expected_effect: str = "",
        risk: str = "",
        estimated_cost: str = "",
        notes: dict[str, str] | None = None,
        coupled: tuple[str, Value, Value] | None = None,
    ) -> ProposalRecord:
        """Record a proposal as pending; ``coupled``: a coupled move's enabling knob, its old
        and its new value. Its texts and notes (a model's words: ``agents.llm``) are stored
        redacted (``Redactor``): a secret the model repeats never reaches the ledger."""
        redact = Redactor.from_environment().text
        with self._session() as s:
            row = ProposalRow(
                round_id=round_id,
                source=source,
                knob=knob,
                old_value=json.dumps(old_value),
                new_value=json.dumps(new_value),
                champion_key=champion_key,
                hypothesis=redact(hypothesis),
                expected_effect=redact(expected_effect),
                risk=redact(risk),
                estimated_cost=redact(estimated_cost),
                notes=_redacted(notes or {}, redact),
                coupled_knob=None if coupled is None else coupled[0],
                coupled_old=None if coupled is None else json.dumps(coupled[1]),
                coupled_new=None if coupled is None else json.dumps(coupled[2]),
                status=str(ProposalStatus.PENDING),
            )
            s.add(row)
            s.flush()
            return proposal_record(row)

    def decide_proposal(
        self,
        proposal_id: int,
        *,
        status: ProposalStatus,
        by: str,
        reason: str | None = None,
        new_value: Value | None = None,
        cluster: str | None = None,
        hypothesis: str | None = None,
        notes: dict[str, str] | None = None,
    ) -> ProposalRecord:
        """Approve, veto or reject a pending proposal (an edit approves a new value, and may
        give the hypothesis and notes that say so); with ``cluster``, only one of that
        cluster's rounds.

        Raises:
            NotInLedger: no such proposal, another cluster's, or it was already decided.
        """
        with self._session() as s:
            row = self._get(s, ProposalRow, proposal_id, lock=True)
            self._of_cluster(s, row, cluster)
            if row.status != ProposalStatus.PENDING:
                raise NotInLedger(
                    f"proposal {proposal_id} is already {row.status}: only a pending one is "
                    "approved or vetoed (`orchestrate proposals list`)",
                    url=self.url,
                )
            row.status = str(ProposalStatus(status))
            row.decided_by = by
            row.reason = reason
            row.decided_at = utcnow()
            if new_value is not None:
                row.new_value = json.dumps(new_value)
            redact = Redactor.from_environment().text
            if hypothesis is not None:
                row.hypothesis = redact(hypothesis)
            if notes is not None:
                row.notes = _redacted(notes, redact)
            s.flush()
            return proposal_record(row)

    def _of_cluster(self, s: Session, row: ProposalRow, cluster: str | None) -> None:
        """Refuses proposal ``row`` of a cluster other than ``cluster`` (``None``: any), in
        one line naming its cluster.

        Raises:
            NotInLedger: it is another cluster's.
        """
        if cluster is None:
            return
        owner = self._get(s, RoundRow, row.round_id).cluster
        if owner != cluster:
            raise NotInLedger(
                f"proposal {row.id} is cluster {owner}'s, not {cluster}'s: decide it with "
                f"{owner}'s profile (`orchestrate proposals list -p …`)",
                url=self.url,
            )

    def proposal(self, proposal_id: int, *, cluster: str | None = None) -> ProposalRecord:
        """Proposal ``proposal_id`` (with ``cluster``: one of that cluster's rounds).

        Raises:
            NotInLedger: no such proposal, or another cluster's.
        """
        with self._session() as s:
            row = self._get(s, ProposalRow, proposal_id)
            self._of_cluster(s, row, cluster)
            return proposal_record(row)

    def proposals(
        self,
        *,
        status: ProposalStatus | None = None,
        round_id: int | None = None,
        cluster: str | None = None,
    ) -> list[ProposalRecord]:
        """Proposals, oldest first, optionally of one status, round or cluster."""
        query = select(ProposalRow).order_by(ProposalRow.id)
        if status is not None:
            query = query.where(ProposalRow.status == str(status))
        if round_id is not None:
            query = query.where(ProposalRow.round_id == round_id)
        if cluster is not None:
            query = query.join(RoundRow, RoundRow.id == ProposalRow.round_id).where(
                RoundRow.cluster == cluster
            )
        with self._session() as s:
            return [proposal_record(r) for r in s.scalars(query)]


def _redacted(notes: Mapping[str, str], redact: Callable[[str], str]) -> dict[str, str]:
    """A proposal's notes with every value redacted (``llm_rejections`` and ``llm_fallback``
    quote the model)."""
    return {key: redact(value) for key, value in notes.items()}
