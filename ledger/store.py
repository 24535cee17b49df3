"""``Ledger``: the one place that opens sessions on the SQL ledger.

Every method is one transaction: it commits before it returns, so a process killed at any
point leaves the ledger at the last completed state change.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any, TypeVar

from sqlalchemy import Engine, create_engine, event, select
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from knobs.config import Config
from knobs.records import CellResultRecord
from knobs.spec import Value
from knobs.vocabulary import (
    BootRole,
    BootStatus,
    EventKind,
    FailureClass,
    Kind,
    ProposalStatus,
    RoundStatus,
    State,
)
from ledger.models import (
    Base,
    BootRow,
    CellResultRow,
    ChampionRow,
    DriftRow,
    EventRow,
    ExperimentRow,
    LeaseRow,
    ProposalRow,
    RoundRow,
    VerdictRow,
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
    VerdictRecord,
)
from ledger.schema import NewerSchema, Upgrade
from ledger.schema import prepare as prepare_schema
from orchestrator.errors import OrchestrateError

T = TypeVar("T")

#: Experiment states, in order. ``decided`` is final.


class LedgerError(OrchestrateError):
    """The ledger cannot be opened, read or written; carries the URL (password hidden)."""

    exit_code = 4

    def __init__(self, message: str, *, url: str) -> None:
        super().__init__(message)
        self.url = url


class LeaseHeld(LedgerError):
    """Another orchestrator holds the cluster's lease; carries the holder. Exit 8, as a node
    claimed by another orchestrator (issue #17)."""

    exit_code = 8

    def __init__(self, message: str, *, url: str, lease: LeaseRecord) -> None:
        super().__init__(message, url=url)
        self.lease = lease


def _dump(value: Value | None) -> str | None:
    return None if value is None else json.dumps(value)


def _load(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def _aware(moment: datetime | None) -> datetime | None:
    # SQLite hands back naive datetimes even for timezone=True columns; they were written as UTC.
    if moment is None or moment.tzinfo is not None:
        return moment
    return moment.replace(tzinfo=utcnow().tzinfo)


class Ledger:
    """The SQL ledger at ``url`` (SQLite or PostgreSQL), created on first use."""

    def __init__(self, url: str) -> None:
        """Open (and if needed create) the ledger.

        Raises:
            LedgerError: a malformed URL, an unreachable server, a schema written by a newer
                orchestrate, or a SQLite file that could not be copied aside before an upgrade.
        """
        try:
            parsed = make_url(url)
        except ArgumentError as e:
            raise LedgerError(
                f"ledger URL {url!r} is not a database URL (e.g. sqlite:///orchestrate.db)",
                url=url,
            ) from e
        self.url = parsed.render_as_string(hide_password=True)
        try:
            if parsed.get_backend_name() == "sqlite":
                # a person approving from another terminal writes while the round waits
                self._engine: Engine = create_engine(url, connect_args={"timeout": 30})
                event.listen(self._engine, "connect", _sqlite_pragmas)
            else:
                self._engine = create_engine(url, pool_pre_ping=True)
        except (SQLAlchemyError, ImportError) as e:
            raise LedgerError(f"cannot open ledger {self.url}: {e}", url=self.url) from e
        self._sessions = sessionmaker(self._engine, expire_on_commit=False)
        try:
            self._create()
        except BaseException:
            self._engine.dispose()
            raise

    def close(self) -> None:
        """Release the connection pool."""
        self._engine.dispose()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    @contextmanager
    def _session(self) -> Iterator[Session]:
        session = self._sessions()
        try:
            yield session
            session.commit()
        except SQLAlchemyError as e:
            session.rollback()
            detail = str(e).splitlines()[0]
            raise LedgerError(f"ledger {self.url}: {detail}", url=self.url) from e
        except BaseException:
            session.rollback()
            raise
        finally:
            session.close()

    def _create(self) -> None:
        # the schema lock (ledger/schema.py) keeps openers of this orchestrate from racing; an
        # older one creating the same new ledger takes none, so a lost race on CREATE TABLE or
        # the schema row is retried. Each lost race means another process created one more
        # table or the row, which cannot be lost on again, so one attempt per table and one
        # for the row (and one to find them all) always suffice
        self.upgraded: Upgrade | None = None
        attempts = len(Base.metadata.tables) + 2
        for attempt in range(attempts):
            try:
                self._create_once()
                return
            except LedgerError as e:
                lost_race = isinstance(e.__cause__, IntegrityError) or "already exists" in e.message
                if attempt == attempts - 1 or not lost_race:
                    raise

    def _create_once(self) -> None:
        with self._session() as s:
            try:
                upgrade = prepare_schema(s.connection())
            except NewerSchema as e:
                raise LedgerError(
                    f"ledger {self.url} is at {e.found}, newer than this orchestrate knows "
                    f"(revision {e.head}): upgrade orchestrate, or use a new ledger URL",
                    url=self.url,
                ) from e
            except OSError as e:
                raise LedgerError(
                    f"cannot copy ledger {self.url} aside before upgrading it: {e}", url=self.url
                ) from e
            if upgrade is not None:
                backup = None if upgrade.backup is None else str(upgrade.backup)
                s.add(
                    EventRow(
                        cluster="*",
                        kind=str(EventKind.LEDGER_UPGRADED),
                        subject=upgrade.to_revision,
                        detail={"from": upgrade.from_revision, "backup": backup},
                        reason=upgrade.line(),
                    )
                )
        self.upgraded = upgrade

    # ---- leases ---------------------------------------------------------------------------
    def acquire_lease(
        self,
        cluster: str,
        *,
        holder: str,
        hostname: str,
        pid: int,
        ttl_s: float,
        stale: Callable[[LeaseRecord], bool],
    ) -> LeaseRecord:
        """Take the cluster's lease for ``holder``.

        A lease is taken over when it has expired, when ``holder`` already holds it, or when
        ``stale(lease)`` says its holder is gone (e.g. a killed process on this host).

        Raises:
            LeaseHeld: a live holder has it.
        """
        now = utcnow()
        with self._session() as s:
            row = s.get(LeaseRow, cluster, with_for_update=True)
            if row is not None:
                current = _lease(row)
                alive = current.expires_at > now and current.holder != holder
                if alive and not stale(current):
                    raise LeaseHeld(
                        f"cluster {cluster} is leased to {current.holder} (pid {current.pid} on "
                        f"{current.hostname}) until {current.expires_at:%Y-%m-%d %H:%M:%S} UTC; "
                        "wait for it, or stop that orchestrator",
                        url=self.url,
                        lease=current,
                    )
                s.delete(row)
                s.flush()
            row = LeaseRow(
                cluster=cluster,
                holder=holder,
                hostname=hostname,
                pid=pid,
                acquired_at=now,
                heartbeat_at=now,
                expires_at=now + timedelta(seconds=ttl_s),
            )
            s.add(row)
            s.flush()
            return _lease(row)

    def renew_lease(self, cluster: str, *, holder: str, ttl_s: float) -> None:
        """Extend ``holder``'s lease.

        Raises:
            LedgerError: the lease is no longer held by ``holder``.
        """
        now = utcnow()
        with self._session() as s:
            row = s.get(LeaseRow, cluster, with_for_update=True)
            if row is None or row.holder != holder:
                raise LedgerError(f"lease on cluster {cluster} was lost by {holder}", url=self.url)
            row.heartbeat_at = now
            row.expires_at = now + timedelta(seconds=ttl_s)

    def release_lease(self, cluster: str, *, holder: str) -> None:
        """Give the lease back if ``holder`` has it."""
        with self._session() as s:
            row = s.get(LeaseRow, cluster)
            if row is not None and row.holder == holder:
                s.delete(row)

    def lease(self, cluster: str) -> LeaseRecord | None:
        """The cluster's lease, if any."""
        with self._session() as s:
            row = s.get(LeaseRow, cluster)
            return None if row is None else _lease(row)

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
            return _round(row)

    def unfinished_round(self, cluster: str) -> RoundRecord | None:
        """The cluster's round that was started and never finished (a killed run), if any."""
        with self._session() as s:
            row = s.scalars(
                select(RoundRow)
                .where(RoundRow.cluster == cluster, RoundRow.status == str(RoundStatus.RUNNING))
                .order_by(RoundRow.id.desc())
            ).first()
            return None if row is None else _round(row)

    def round(self, round_id: int) -> RoundRecord:
        """Round ``round_id``.

        Raises:
            LedgerError: no such round.
        """
        with self._session() as s:
            return _round(self._get(s, RoundRow, round_id))

    def rounds(self, cluster: str) -> list[RoundRecord]:
        """Every round of ``cluster``, oldest first."""
        with self._session() as s:
            rows = s.scalars(
                select(RoundRow).where(RoundRow.cluster == cluster).order_by(RoundRow.id)
            )
            return [_round(r) for r in rows]

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
            return [_boot(r) for r in rows]

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
    ) -> ProposalRecord:
        """Record a proposal as pending."""
        with self._session() as s:
            row = ProposalRow(
                round_id=round_id,
                source=source,
                knob=knob,
                old_value=json.dumps(old_value),
                new_value=json.dumps(new_value),
                champion_key=champion_key,
                hypothesis=hypothesis,
                expected_effect=expected_effect,
                risk=risk,
                estimated_cost=estimated_cost,
                notes=dict(notes or {}),
                status=str(ProposalStatus.PENDING),
            )
            s.add(row)
            s.flush()
            return _proposal(row)

    def decide_proposal(
        self,
        proposal_id: int,
        *,
        status: ProposalStatus,
        by: str,
        reason: str | None = None,
        new_value: Value | None = None,
    ) -> ProposalRecord:
        """Approve, veto or reject a pending proposal (an edit approves a new value).

        Raises:
            LedgerError: no such proposal, or it was already decided.
        """
        with self._session() as s:
            row = self._get(s, ProposalRow, proposal_id, lock=True)
            if row.status != ProposalStatus.PENDING:
                raise LedgerError(f"proposal {proposal_id} is already {row.status}", url=self.url)
            row.status = str(ProposalStatus(status))
            row.decided_by = by
            row.reason = reason
            row.decided_at = utcnow()
            if new_value is not None:
                row.new_value = json.dumps(new_value)
            s.flush()
            return _proposal(row)

    def proposal(self, proposal_id: int) -> ProposalRecord:
        """Proposal ``proposal_id``.

        Raises:
            LedgerError: no such proposal.
        """
        with self._session() as s:
            return _proposal(self._get(s, ProposalRow, proposal_id))

    def proposals(
        self, *, status: ProposalStatus | None = None, round_id: int | None = None
    ) -> list[ProposalRecord]:
        """Proposals, oldest first, optionally of one status or round."""
        query = select(ProposalRow).order_by(ProposalRow.id)
        if status is not None:
            query = query.where(ProposalRow.status == str(status))
        if round_id is not None:
            query = query.where(ProposalRow.round_id == round_id)
        with self._session() as s:
            return [_proposal(r) for r in s.scalars(query)]

    # ---- experiments ----------------------------------------------------------------------
    def add_experiment(
        self,
        *,
        cluster: str,
        round_id: int,
        kind: Kind,
        config: Config,
        champion_key: str | None,
        champion_objective: float | None,
        proposal_id: int | None = None,
        knob: str | None = None,
        value: Value | None = None,
        description: str = "",
        state: State = State.APPROVED,
    ) -> ExperimentRecord:
        """Record an experiment that is about to run (or a vetoed one, state ``decided``)."""
        with self._session() as s:
            row = ExperimentRow(
                cluster=cluster,
                round_id=round_id,
                proposal_id=proposal_id,
                kind=str(kind),
                config_json=config.to_json(),
                config_key=config.key,
                champion_key=champion_key,
                champion_objective=champion_objective,
                knob=knob,
                value=_dump(value),
                description=description,
                state=str(state),
            )
            s.add(row)
            s.flush()
            return _experiment(row)

    def experiment(self, experiment_id: int) -> ExperimentRecord:
        """Experiment ``experiment_id``.

        Raises:
            LedgerError: no such experiment.
        """
        with self._session() as s:
            return _experiment(self._get(s, ExperimentRow, experiment_id))

    def experiments(
        self, *, cluster: str | None = None, round_id: int | None = None
    ) -> list[ExperimentRecord]:
        """Experiments, oldest first."""
        query = select(ExperimentRow).order_by(ExperimentRow.id)
        if cluster is not None:
            query = query.where(ExperimentRow.cluster == cluster)
        if round_id is not None:
            query = query.where(ExperimentRow.round_id == round_id)
        with self._session() as s:
            return [_experiment(r) for r in s.scalars(query)]

    def set_state(self, experiment_id: int, state: State) -> None:
        """Move an undecided experiment to ``state``.

        Raises:
            LedgerError: unknown state, or the experiment is already decided.
        """
        if state not in set(State):
            raise LedgerError(f"unknown experiment state {state!r}", url=self.url)
        with self._session() as s:
            row = self._get(s, ExperimentRow, experiment_id, lock=True)
            if row.state == State.DECIDED:
                raise LedgerError(f"experiment {experiment_id} is already decided", url=self.url)
            row.state = str(state)

    def set_experiment_mlflow(self, experiment_id: int, run_id: str) -> None:
        """Remember the experiment's MLflow child run."""
        with self._session() as s:
            self._get(s, ExperimentRow, experiment_id).mlflow_run_id = run_id

    def decide(
        self,
        experiment_id: int,
        *,
        verdict: VerdictRecord,
        objective: float | None,
        delta_pct: float | None,
        accept_len: float | None,
        failure_class: FailureClass | None = None,
        failure_detail: str | None = None,
        promote: bool = False,
    ) -> ExperimentRecord:
        """Decide an experiment; with ``promote`` its config becomes the cluster's champion
        in the same transaction.

        Raises:
            LedgerError: no such experiment, or already decided.
        """
        now = utcnow()
        with self._session() as s:
            row = self._get(s, ExperimentRow, experiment_id, lock=True)
            if row.state == State.DECIDED:
                raise LedgerError(f"experiment {experiment_id} is already decided", url=self.url)
            row.state = str(State.DECIDED)
            row.status = str(verdict.status)
            row.objective = objective
            row.delta_pct = delta_pct
            row.accept_len = accept_len
            row.failure_class = failure_class
            row.failure_detail = failure_detail
            row.decided_at = now
            s.add(
                VerdictRow(
                    experiment_id=experiment_id,
                    status=str(verdict.status),
                    rule=verdict.rule,
                    reason=verdict.reason,
                    stats=dict(verdict.stats),
                )
            )
            if promote:
                if objective is None:
                    raise LedgerError(
                        f"experiment {experiment_id}: a champion needs an objective", url=self.url
                    )
                for old in s.scalars(
                    select(ChampionRow).where(
                        ChampionRow.cluster == row.cluster, ChampionRow.retired_at.is_(None)
                    )
                ):
                    old.retired_at = now
                s.add(
                    ChampionRow(
                        cluster=row.cluster,
                        experiment_id=experiment_id,
                        config_json=row.config_json,
                        config_key=row.config_key,
                        objective=objective,
                        since=now,
                    )
                )
            s.flush()
            return _experiment(row)

    def verdict(self, experiment_id: int) -> VerdictRecord | None:
        """The verdict of an experiment, if decided."""
        with self._session() as s:
            row = s.scalars(
                select(VerdictRow).where(VerdictRow.experiment_id == experiment_id)
            ).first()
            if row is None:
                return None
            return VerdictRecord(
                status=row.status, rule=row.rule, reason=row.reason, stats=row.stats
            )

    # ---- champion -------------------------------------------------------------------------
    def champion(self, cluster: str) -> ChampionRecord | None:
        """The cluster's current champion, if one was ever measured."""
        with self._session() as s:
            row = _current_champion(s, cluster)
            return None if row is None else _champion(row)

    def champion_history(self, cluster: str) -> list[ChampionRecord]:
        """Every champion the cluster had, oldest first."""
        with self._session() as s:
            rows = s.scalars(
                select(ChampionRow).where(ChampionRow.cluster == cluster).order_by(ChampionRow.id)
            )
            return [_champion(r) for r in rows]

    # ---- boots and cells ------------------------------------------------------------------
    def start_boot(
        self,
        experiment_id: int,
        config: Config,
        *,
        role: BootRole = BootRole.MEASURE,
        measurement: int | None = None,
    ) -> BootRecord:
        """Record that a boot of ``config`` begins (stop-all is its first step).

        ``measurement`` continues an interrupted measurement; by default the boot starts the
        experiment's next one.
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
            )
            s.add(row)
            s.flush()
            return _boot(row)

    def end_boot(
        self,
        boot_id: int,
        *,
        status: BootStatus,
        failure_class: FailureClass | None = None,
        failure_detail: str | None = None,
    ) -> None:
        """Mark a boot ``up`` (healthy), ``failed`` or ``down`` (torn down after use)."""
        with self._session() as s:
            row = self._get(s, BootRow, boot_id)
            row.status = str(status)
            if status == BootStatus.UP:
                row.healthy_at = utcnow()
            else:
                row.ended_at = utcnow()
            row.failure_class = failure_class or row.failure_class
            row.failure_detail = failure_detail or row.failure_detail

    def boots(self, experiment_id: int) -> list[BootRecord]:
        """The boots of an experiment, oldest first."""
        with self._session() as s:
            rows = s.scalars(
                select(BootRow).where(BootRow.experiment_id == experiment_id).order_by(BootRow.id)
            )
            return [_boot(r) for r in rows]

    def open_boots(self) -> list[BootRecord]:
        """Boots never marked down or failed: servers that may still run."""
        with self._session() as s:
            rows = s.scalars(
                select(BootRow).where(
                    BootRow.status.in_((str(BootStatus.BOOTING), str(BootStatus.UP)))
                )
            )
            return [_boot(r) for r in rows]

    def add_cell_result(
        self, experiment_id: int, boot_id: int, result: CellResultRecord, *, repeat: int = 0
    ) -> None:
        """Record one measured cell.

        Raises:
            LedgerError: that cell of that boot and repeat is already recorded.
        """
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
                )
            )

    def cell_results(self, experiment_id: int) -> list[tuple[int, int, CellResultRecord]]:
        """``(boot_id, repeat, result)`` of every cell of an experiment, in recording order."""
        with self._session() as s:
            rows = s.scalars(
                select(CellResultRow)
                .where(CellResultRow.experiment_id == experiment_id)
                .order_by(CellResultRow.id)
            )
            return [(r.boot_id, r.repeat, CellResultRecord.model_validate(r.record)) for r in rows]

    def set_champion_objective(self, cluster: str, objective: float) -> None:
        """The champion's best estimate changed (a re-measurement)."""
        with self._session() as s:
            row = _current_champion(s, cluster)
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
            return _drift(row)

    def drifts(self, cluster: str) -> list[DriftRecord]:
        """Every drift record of the cluster, oldest first."""
        with self._session() as s:
            rows = s.scalars(
                select(DriftRow).where(DriftRow.cluster == cluster).order_by(DriftRow.id)
            )
            return [_drift(r) for r in rows]

    # ---- helpers --------------------------------------------------------------------------
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
            return _event(row)

    def events(self, cluster: str, kind: EventKind | None = None) -> list[EventRecord]:
        """The cluster's events (of ``kind``, if given), oldest first."""
        with self._session() as s:
            query = select(EventRow).where(EventRow.cluster == cluster)
            if kind is not None:
                query = query.where(EventRow.kind == str(kind))
            return [_event(r) for r in s.scalars(query.order_by(EventRow.id))]

    def _get(self, s: Session, cls: type[T], key: object, *, lock: bool = False) -> T:
        row = s.get(cls, key, with_for_update=lock)
        if row is None:
            name = getattr(cls, "__tablename__", cls.__name__)
            raise LedgerError(f"no {name} {key} in ledger {self.url}", url=self.url)
        return row


def _current_champion(s: Session, cluster: str) -> ChampionRow | None:
    return s.scalars(
        select(ChampionRow)
        .where(ChampionRow.cluster == cluster, ChampionRow.retired_at.is_(None))
        .order_by(ChampionRow.id.desc())
    ).first()


def _champion(row: ChampionRow) -> ChampionRecord:
    return ChampionRecord(
        id=row.id,
        cluster=row.cluster,
        experiment_id=row.experiment_id,
        config=Config.from_json(row.config_json),
        objective=row.objective,
        since=_aware(row.since) or row.since,
    )


def _drift(row: DriftRow) -> DriftRecord:
    return DriftRecord(
        cluster=row.cluster,
        experiment_id=row.experiment_id,
        measurement=row.measurement,
        before=row.before,
        after=row.after,
        drift_pct=row.drift_pct,
        significant=row.significant,
        created_at=_aware(row.created_at) or row.created_at,
    )


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def _lease(row: LeaseRow) -> LeaseRecord:
    return LeaseRecord(
        cluster=row.cluster,
        holder=row.holder,
        hostname=row.hostname,
        pid=row.pid,
        acquired_at=_aware(row.acquired_at) or row.acquired_at,
        heartbeat_at=_aware(row.heartbeat_at) or row.heartbeat_at,
        expires_at=_aware(row.expires_at) or row.expires_at,
    )


def _round(row: RoundRow) -> RoundRecord:
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
        started_at=_aware(row.started_at) or row.started_at,
        finished_at=_aware(row.finished_at),
        mlflow_run_id=row.mlflow_run_id,
        max_hours=row.max_hours,
        max_gpu_hours=row.max_gpu_hours,
    )


def _proposal(row: ProposalRow) -> ProposalRecord:
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
        status=row.status,
        decided_by=row.decided_by,
        reason=row.reason,
        created_at=_aware(row.created_at) or row.created_at,
        decided_at=_aware(row.decided_at),
    )


def _experiment(row: ExperimentRow) -> ExperimentRecord:
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
        value=_load(row.value),
        description=row.description,
        state=row.state,
        status=row.status,
        objective=row.objective,
        delta_pct=row.delta_pct,
        accept_len=row.accept_len,
        failure_class=row.failure_class,
        failure_detail=row.failure_detail,
        created_at=_aware(row.created_at) or row.created_at,
        decided_at=_aware(row.decided_at),
        mlflow_run_id=row.mlflow_run_id,
    )


def _boot(row: BootRow) -> BootRecord:
    return BootRecord(
        id=row.id,
        experiment_id=row.experiment_id,
        config_key=row.config_key,
        role=row.role,
        measurement=row.measurement,
        status=row.status,
        failure_class=row.failure_class,
        failure_detail=row.failure_detail,
        started_at=_aware(row.started_at) or row.started_at,
        healthy_at=_aware(row.healthy_at),
        ended_at=_aware(row.ended_at),
    )


def _event(row: EventRow) -> EventRecord:
    return EventRecord(
        id=row.id,
        cluster=row.cluster,
        kind=row.kind,
        subject=row.subject,
        detail=dict(row.detail or {}),
        reason=row.reason,
        actor=row.actor,
        created_at=_aware(row.created_at) or row.created_at,
    )
