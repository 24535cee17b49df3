"""SQLAlchemy 2.0 models of the ledger. Every state change of a round is one of these rows."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    DateTime,
    Float,
    ForeignKey,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

#: The schema's number: the newest Alembic revision of ``ledger/migrations`` as an int, bumped
#: with each new revision. ``alembic_version`` is the truth; the ``schema_version`` row mirrors
#: this, so that an orchestrate from before the revisions refuses a newer ledger.
SCHEMA_VERSION = 9


def utcnow() -> datetime:
    """Now, timezone-aware UTC."""
    return datetime.now(UTC)


class Base(DeclarativeBase):
    """Declarative base of every ledger table."""

    type_annotation_map: ClassVar[dict[Any, Any]] = {
        datetime: DateTime(timezone=True),
        dict: JSON,
    }


class SchemaRow(Base):
    """One row: the schema version this database was created with."""

    __tablename__ = "schema_version"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    version: Mapped[int] = mapped_column(Integer)


class LeaseRow(Base):
    """Who drives a cluster now: one orchestrator per cluster."""

    __tablename__ = "lease"

    cluster: Mapped[str] = mapped_column(String(128), primary_key=True)
    holder: Mapped[str] = mapped_column(String(256))
    hostname: Mapped[str] = mapped_column(String(256))
    pid: Mapped[int] = mapped_column(Integer)
    acquired_at: Mapped[datetime]
    heartbeat_at: Mapped[datetime]
    expires_at: Mapped[datetime]


class RoundRow(Base):
    """One ``orchestrate round`` invocation and its budget; resumed until done."""

    __tablename__ = "round"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    cluster: Mapped[str] = mapped_column(String(128), index=True)
    profile_name: Mapped[str] = mapped_column(String(128))
    profile_digest: Mapped[str] = mapped_column(String(64))
    budget: Mapped[int] = mapped_column(Integer)
    proposer: Mapped[str] = mapped_column(String(64))
    approve: Mapped[str] = mapped_column(String(16))
    seed: Mapped[int] = mapped_column(Integer, default=0)
    status: Mapped[str] = mapped_column(String(16), default="running")
    started_at: Mapped[datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[datetime | None]
    mlflow_run_id: Mapped[str | None] = mapped_column(String(64))
    # the wall-clock cap the round was started with, kept for its resumes (None: no cap)
    max_hours: Mapped[float | None] = mapped_column(Float)
    # the GPU-hours cap (boots included), kept for its resumes (None: no cap); schema 3
    max_gpu_hours: Mapped[float | None] = mapped_column(Float)


class ProposalRow(Base):
    """A proposed one-knob change (or coupled move) and what a person (or the gate) decided."""

    __tablename__ = "proposal"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    round_id: Mapped[int] = mapped_column(ForeignKey("round.id"), index=True)
    source: Mapped[str] = mapped_column(String(64))
    knob: Mapped[str] = mapped_column(String(64))
    old_value: Mapped[str] = mapped_column(Text)  # JSON of the value
    new_value: Mapped[str] = mapped_column(Text)
    champion_key: Mapped[str] = mapped_column(String(32))
    hypothesis: Mapped[str] = mapped_column(Text, default="")
    expected_effect: Mapped[str] = mapped_column(Text, default="")
    risk: Mapped[str] = mapped_column(Text, default="")
    estimated_cost: Mapped[str] = mapped_column(Text, default="")
    notes: Mapped[dict[str, str]] = mapped_column(JSON, default=dict)
    # a coupled move's enabling knob and its values (JSON), NULL for a one-knob change; schema 4
    coupled_knob: Mapped[str | None] = mapped_column(String(64))
    coupled_old: Mapped[str | None] = mapped_column(Text)
    coupled_new: Mapped[str | None] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16), default="pending")
    decided_by: Mapped[str | None] = mapped_column(String(64))
    reason: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    decided_at: Mapped[datetime | None]


class ExperimentRow(Base):
    """One configuration measured (or refused, or crashed): one results.tsv row once decided."""

    __tablename__ = "experiment"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    cluster: Mapped[str] = mapped_column(String(128), index=True)
    round_id: Mapped[int] = mapped_column(ForeignKey("round.id"), index=True)
    proposal_id: Mapped[int | None] = mapped_column(ForeignKey("proposal.id"), unique=True)
    kind: Mapped[str] = mapped_column(String(16))  # baseline | candidate
    config_json: Mapped[str] = mapped_column(Text)
    config_key: Mapped[str] = mapped_column(String(32), index=True)
    champion_key: Mapped[str | None] = mapped_column(String(32))
    champion_objective: Mapped[float | None] = mapped_column(Float)
    knob: Mapped[str | None] = mapped_column(String(64))
    value: Mapped[str | None] = mapped_column(Text)  # JSON of the new value
    # a coupled move's enabling knob and its new value (JSON); NULL otherwise; schema 4
    coupled_knob: Mapped[str | None] = mapped_column(String(64))
    coupled_value: Mapped[str | None] = mapped_column(Text)
    # a change's parent: the champion's experiment it was proposed against; NULL for a
    # baseline, and for the rows before schema 8 (``evolution.Lineage.parent`` infers theirs)
    parent_experiment_id: Mapped[int | None] = mapped_column(Integer)
    description: Mapped[str] = mapped_column(Text, default="")
    state: Mapped[str] = mapped_column(String(16), default="approved")
    status: Mapped[str | None] = mapped_column(String(16))
    objective: Mapped[float | None] = mapped_column(Float)
    delta_pct: Mapped[float | None] = mapped_column(Float)
    accept_len: Mapped[float | None] = mapped_column(Float)
    failure_class: Mapped[str | None] = mapped_column(String(32))
    failure_detail: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    decided_at: Mapped[datetime | None]
    mlflow_run_id: Mapped[str | None] = mapped_column(String(64))


class BootRow(Base):
    """One deploy of a config on every node, from stop-all to healthy (or failed) to down."""

    __tablename__ = "boot"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiment.id"), index=True)
    config_key: Mapped[str] = mapped_column(String(32))
    # measure | repeat | confirm | remeasure: why this boot happened
    role: Mapped[str] = mapped_column(String(16), default="measure")
    # boots of one measurement: a boot interrupted mid-cells is continued by another boot
    measurement: Mapped[int] = mapped_column(Integer, default=0)
    status: Mapped[str] = mapped_column(String(16), default="booting")  # booting|up|failed|down
    failure_class: Mapped[str | None] = mapped_column(String(32))
    failure_detail: Mapped[str | None] = mapped_column(Text)
    # the node a failed boot failed on, as its error named it (schema 6; NULL before, or when
    # no node was named)
    failed_rank: Mapped[int | None] = mapped_column(Integer)
    failed_host: Mapped[str | None] = mapped_column(String(255))
    started_at: Mapped[datetime] = mapped_column(default=utcnow)
    healthy_at: Mapped[datetime | None]
    ended_at: Mapped[datetime | None]
    # a digest of the launchers the boot rendered (schema 9; NULL before): a reading counts
    # for a config only under the rendering it has now
    rendering: Mapped[str | None] = mapped_column(String(64))


class CellResultRow(Base):
    """What one bench cell measured on one boot of one experiment."""

    __tablename__ = "cell_result"
    __table_args__ = (UniqueConstraint("experiment_id", "boot_id", "cell", "repeat"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiment.id"), index=True)
    boot_id: Mapped[int] = mapped_column(ForeignKey("boot.id"))
    cell: Mapped[str] = mapped_column(String(64))
    repeat: Mapped[int] = mapped_column(Integer, default=0)
    output_throughput: Mapped[float] = mapped_column(Float)
    accepted_per_step: Mapped[float | None] = mapped_column(Float)
    p90_ttft_ms: Mapped[float] = mapped_column(Float)
    errors: Mapped[int] = mapped_column(Integer)
    record: Mapped[dict[str, object]] = mapped_column(JSON)
    # the cell's definition it was measured under, a ``CellSpec`` (schema 7; NULL before)
    spec: Mapped[dict[str, object] | None] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class VerdictRow(Base):
    """The decision on an experiment and the evidence it rests on."""

    __tablename__ = "verdict"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiment.id"), unique=True)
    status: Mapped[str] = mapped_column(String(16))
    rule: Mapped[str] = mapped_column(String(64))
    reason: Mapped[str] = mapped_column(Text)
    stats: Mapped[dict[str, object]] = mapped_column(JSON, default=dict)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class DriftRow(Base):
    """A re-measurement of the champion and how far it moved from what was known."""

    __tablename__ = "drift"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    cluster: Mapped[str] = mapped_column(String(128), index=True)
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiment.id"))
    measurement: Mapped[int] = mapped_column(Integer)
    before: Mapped[float] = mapped_column(Float)
    after: Mapped[float] = mapped_column(Float)
    drift_pct: Mapped[float] = mapped_column(Float)
    significant: Mapped[bool]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class ChampionRow(Base):
    """The champion history of a cluster; the newest unretired row is the champion."""

    __tablename__ = "champion"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    cluster: Mapped[str] = mapped_column(String(128), index=True)
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiment.id"))
    config_json: Mapped[str] = mapped_column(Text)
    config_key: Mapped[str] = mapped_column(String(32))
    objective: Mapped[float] = mapped_column(Float)
    since: Mapped[datetime] = mapped_column(default=utcnow)
    retired_at: Mapped[datetime | None]


class EventRow(Base):
    """Something done to the record outside a verdict, and why; kept for good.

    A known-bad region cleared by a person, a stale node claim broken with ``--force``, a
    knob the profile gained or lost under a champion: ``kind`` says which
    (``knobs.vocabulary.EventKind``), ``subject`` what it was done to (an experiment id, a
    node, a knob), ``detail`` the evidence.
    """

    __tablename__ = "event"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    cluster: Mapped[str] = mapped_column(String(128), index=True)
    kind: Mapped[str] = mapped_column(String(32), index=True)
    subject: Mapped[str] = mapped_column(String(128), default="")
    detail: Mapped[dict[str, object]] = mapped_column(JSON, default=dict)
    reason: Mapped[str] = mapped_column(Text, default="")
    actor: Mapped[str] = mapped_column(String(256), default="")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class HeldTextRow(Base):
    """A text for an experiment's MLflow run (a boot's launchers, its engine logs) that MLflow
    did not take when it was written (``orchestrator.mirror``): held here, redacted and
    zlib-compressed, until MLflow takes it; then deleted."""

    __tablename__ = "held_text"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiment.id"), index=True)
    path: Mapped[str] = mapped_column(String(512))
    body: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
