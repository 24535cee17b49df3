"""Experiments, their verdicts, and the champion they make."""

from __future__ import annotations

from sqlalchemy import select

from knobs.config import Config
from knobs.spec import Value
from knobs.vocabulary import FailureClass, Kind, State
from ledger.base import LedgerBase
from ledger.errors import LedgerError
from ledger.models import ChampionRow, ExperimentRow, VerdictRow, utcnow
from ledger.records import ChampionRecord, ExperimentRecord, VerdictRecord
from ledger.rows import champion_record, current_champion, dump_value, experiment_record


class Experiments(LedgerBase):
    """Experiments, their verdicts, and the champion they make."""

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
        coupled: tuple[str, Value] | None = None,
        parent: int | None = None,
    ) -> ExperimentRecord:
        """Record an experiment that is about to run (or a vetoed one, state ``decided``);
        ``coupled``: a coupled move's enabling knob and its new value; ``parent``: a change's
        parent, the experiment of the champion it was proposed against."""
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
                value=dump_value(value),
                coupled_knob=None if coupled is None else coupled[0],
                coupled_value=None if coupled is None else dump_value(coupled[1]),
                parent_experiment_id=parent,
                description=description,
                state=str(state),
            )
            s.add(row)
            s.flush()
            return experiment_record(row)

    def experiment(self, experiment_id: int) -> ExperimentRecord:
        """Experiment ``experiment_id``.

        Raises:
            LedgerError: no such experiment.
        """
        with self._session() as s:
            return experiment_record(self._get(s, ExperimentRow, experiment_id))

    def find_experiment(self, cluster: str, experiment_id: int) -> ExperimentRecord | None:
        """Experiment ``experiment_id`` if it is ``cluster``'s (an ID a person typed), else
        ``None``."""
        with self._session() as s:
            row = s.get(ExperimentRow, experiment_id)
            return None if row is None or row.cluster != cluster else experiment_record(row)

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
            return [experiment_record(r) for r in s.scalars(query)]

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
        description: str | None = None,
    ) -> ExperimentRecord:
        """Decide an experiment; with ``promote`` its config becomes the cluster's champion
        in the same transaction; ``description``: what results.tsv says of it from then on
        (a person's veto of an experiment under way adds their words).

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
            if description is not None:
                row.description = description
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
            return experiment_record(row)

    def verdict(self, experiment_id: int) -> VerdictRecord | None:
        """The verdict of an experiment, if decided (read from the database once: a verdict
        never changes)."""
        known = self._verdicts.get(experiment_id)
        if known is not None:
            return known
        with self._session() as s:
            row = s.scalars(
                select(VerdictRow).where(VerdictRow.experiment_id == experiment_id)
            ).first()
            if row is None:
                return None
            verdict = VerdictRecord(
                status=row.status, rule=row.rule, reason=row.reason, stats=row.stats
            )
        self._verdicts[experiment_id] = verdict
        return verdict

    # ---- champion -------------------------------------------------------------------------
    def champion(self, cluster: str) -> ChampionRecord | None:
        """The cluster's current champion, if one was ever measured."""
        with self._session() as s:
            row = current_champion(s, cluster)
            return None if row is None else champion_record(row)

    def champion_history(self, cluster: str) -> list[ChampionRecord]:
        """Every champion the cluster had, oldest first."""
        with self._session() as s:
            rows = s.scalars(
                select(ChampionRow).where(ChampionRow.cluster == cluster).order_by(ChampionRow.id)
            )
            return [champion_record(r) for r in rows]
