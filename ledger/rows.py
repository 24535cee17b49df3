"""Rows into frozen records, and the JSON and time conventions of the columns."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from knobs.config import Config
from knobs.spec import Value
from knobs.vocabulary import read_failure_class
from ledger.models import (
    BootRow,
    ChampionRow,
    DriftRow,
    EventRow,
    ExperimentRow,
    LeaseRow,
    ProposalRow,
    RoundRow,
    utcnow,
)
from ledger.records import (
    BootRecord,
    ChampionRecord,
    DriftRecord,
    EventRecord,
    ExperimentRecord,
    LeaseRecord,
    ProposalRecord,
    RoundRecord,
)


def dump_value(value: Value | None) -> str | None:
    return None if value is None else json.dumps(value)


def load_value(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def aware(moment: datetime | None) -> datetime | None:
    # SQLite hands back naive datetimes even for timezone=True columns; they were written as UTC.
    if moment is None or moment.tzinfo is not None:
        return moment
    return moment.replace(tzinfo=utcnow().tzinfo)


def current_champion(s: Session, cluster: str) -> ChampionRow | None:
    return s.scalars(
        select(ChampionRow)
        .where(ChampionRow.cluster == cluster, ChampionRow.retired_at.is_(None))
        .order_by(ChampionRow.id.desc())
    ).first()


def champion_record(row: ChampionRow) -> ChampionRecord:
    return ChampionRecord(
        id=row.id,
        cluster=row.cluster,
        experiment_id=row.experiment_id,
        config=Config.from_json(row.config_json),
        objective=row.objective,
        since=aware(row.since) or row.since,
    )


def drift_record(row: DriftRow) -> DriftRecord:
    return DriftRecord(
        cluster=row.cluster,
        experiment_id=row.experiment_id,
        measurement=row.measurement,
        before=row.before,
        after=row.after,
        drift_pct=row.drift_pct,
        significant=row.significant,
        created_at=aware(row.created_at) or row.created_at,
    )


def lease_record(row: LeaseRow) -> LeaseRecord:
    return LeaseRecord(
        cluster=row.cluster,
        holder=row.holder,
        hostname=row.hostname,
        pid=row.pid,
        acquired_at=aware(row.acquired_at) or row.acquired_at,
        heartbeat_at=aware(row.heartbeat_at) or row.heartbeat_at,
        expires_at=aware(row.expires_at) or row.expires_at,
    )


def round_record(row: RoundRow) -> RoundRecord:
    return RoundRecord(
        id=row.id,
        cluster=row.cluster,
        profile_name=row.profile_name,
        profile_digest=row.profile_digest,
        budget=row.budget,
        proposer=row.proposer,
        approve=row.approve,
        seed=row.seed,
        status=row.status,
        started_at=aware(row.started_at) or row.started_at,
        finished_at=aware(row.finished_at),
        mlflow_run_id=row.mlflow_run_id,
        max_hours=row.max_hours,
        max_gpu_hours=row.max_gpu_hours,
    )


def proposal_record(row: ProposalRow) -> ProposalRecord:
    return ProposalRecord(
        id=row.id,
        round_id=row.round_id,
        source=row.source,
        knob=row.knob,
        old_value=json.loads(row.old_value),
        new_value=json.loads(row.new_value),
        champion_key=row.champion_key,
        hypothesis=row.hypothesis,
        expected_effect=row.expected_effect,
        risk=row.risk,
        estimated_cost=row.estimated_cost,
        notes=dict(row.notes or {}),
        coupled_knob=row.coupled_knob,
        coupled_old=load_value(row.coupled_old),
        coupled_new=load_value(row.coupled_new),
        status=row.status,
        decided_by=row.decided_by,
        reason=row.reason,
        created_at=aware(row.created_at) or row.created_at,
        decided_at=aware(row.decided_at),
    )


def experiment_record(row: ExperimentRow) -> ExperimentRecord:
    return ExperimentRecord(
        id=row.id,
        cluster=row.cluster,
        round_id=row.round_id,
        proposal_id=row.proposal_id,
        kind=row.kind,
        config=Config.from_json(row.config_json),
        champion_key=row.champion_key,
        champion_objective=row.champion_objective,
        knob=row.knob,
        value=load_value(row.value),
        coupled_knob=row.coupled_knob,
        coupled_value=load_value(row.coupled_value),
        parent_experiment_id=row.parent_experiment_id,
        description=row.description,
        state=row.state,
        status=row.status,
        objective=row.objective,
        delta_pct=row.delta_pct,
        accept_len=row.accept_len,
        failure_class=read_failure_class(row.failure_class, row.failure_detail),
        failure_detail=row.failure_detail,
        created_at=aware(row.created_at) or row.created_at,
        decided_at=aware(row.decided_at),
        mlflow_run_id=row.mlflow_run_id,
    )


def boot_record(row: BootRow) -> BootRecord:
    return BootRecord(
        id=row.id,
        experiment_id=row.experiment_id,
        config_key=row.config_key,
        role=row.role,
        measurement=row.measurement,
        status=row.status,
        failure_class=read_failure_class(row.failure_class, row.failure_detail),
        failure_detail=row.failure_detail,
        started_at=aware(row.started_at) or row.started_at,
        healthy_at=aware(row.healthy_at),
        ended_at=aware(row.ended_at),
        failed_rank=row.failed_rank,
        failed_host=row.failed_host,
        rendering=row.rendering,
    )


def event_record(row: EventRow) -> EventRecord:
    return EventRecord(
        id=row.id,
        cluster=row.cluster,
        kind=row.kind,
        subject=row.subject,
        detail=dict(row.detail or {}),
        reason=row.reason,
        actor=row.actor,
        created_at=aware(row.created_at) or row.created_at,
    )
