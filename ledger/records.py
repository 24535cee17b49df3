"""Frozen records the ledger hands out; callers never hold ORM rows or sessions."""

from __future__ import annotations

from datetime import datetime
from typing import NamedTuple

from pydantic import BaseModel, ConfigDict

from knobs.config import Change, Config
from knobs.records import CellResultRecord, CellSpec, LlmUsage
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
    Status,
)


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)


class LeaseRecord(_Record):
    """Who holds a cluster's lease."""

    cluster: str
    holder: str
    hostname: str
    pid: int
    acquired_at: datetime
    heartbeat_at: datetime
    expires_at: datetime


class RoundRecord(_Record):
    """A round: its budget, proposer, approval mode and state."""

    id: int
    cluster: str
    profile_name: str
    profile_digest: str
    budget: int
    proposer: str
    approve: str
    seed: int
    status: RoundStatus
    started_at: datetime
    finished_at: datetime | None
    mlflow_run_id: str | None
    max_hours: float | None = None
    #: the round's GPU-hours cap, boots included (``None``: none)
    max_gpu_hours: float | None = None


class ProposalRecord(_Record):
    """A proposed change and its decision (pending, approved, vetoed, rejected)."""

    id: int
    round_id: int
    source: str
    knob: str
    old_value: Value
    new_value: Value
    champion_key: str
    hypothesis: str
    expected_effect: str
    risk: str
    estimated_cost: str
    notes: dict[str, str]
    status: ProposalStatus
    decided_by: str | None
    reason: str | None
    created_at: datetime
    decided_at: datetime | None
    #: a coupled move's enabling knob and its values (``knobs.config.Change.enabling``)
    coupled_knob: str | None = None
    coupled_old: Value | None = None
    coupled_new: Value | None = None

    @property
    def change(self) -> Change:
        """The proposed change as recorded (old and new values as the ledger has them)."""
        enabling = (
            None
            if self.coupled_knob is None or self.coupled_old is None or self.coupled_new is None
            else Change(knob=self.coupled_knob, old=self.coupled_old, new=self.coupled_new)
        )
        return Change(knob=self.knob, old=self.old_value, new=self.new_value, enabling=enabling)

    @property
    def llm(self) -> LlmUsage | None:
        """What the proposal's LLM calls used and cost (``None``: no LLM was asked)."""
        return LlmUsage.from_notes(self.notes)


class ExperimentRecord(_Record):
    """An experiment, from approved to decided."""

    id: int
    cluster: str
    round_id: int
    proposal_id: int | None
    kind: Kind
    config: Config
    champion_key: str | None
    champion_objective: float | None
    knob: str | None
    value: Value | None
    description: str
    state: State
    status: Status | None
    objective: float | None
    delta_pct: float | None
    accept_len: float | None
    failure_class: FailureClass | None
    failure_detail: str | None
    created_at: datetime
    decided_at: datetime | None
    mlflow_run_id: str | None
    #: a coupled move's enabling knob and its new value (``agents.coupled``); else None
    coupled_knob: str | None = None
    coupled_value: Value | None = None
    #: a change's parent, the champion's experiment it was proposed against, as recorded
    #: (schema 8); None for a baseline and for a row an older release wrote: read parents
    #: through ``evolution.Lineage.parent``, which infers those
    parent_experiment_id: int | None = None

    @property
    def label(self) -> str | None:
        """The changed knob as results.tsv names it: ``knob``, ``knob+other`` when coupled."""
        if self.knob is None or self.coupled_knob is None:
            return self.knob
        return f"{self.knob}+{self.coupled_knob}"


class BootRecord(_Record):
    """One boot of an experiment's config."""

    id: int
    experiment_id: int
    config_key: str
    role: BootRole
    measurement: int
    status: BootStatus
    failure_class: FailureClass | None
    failure_detail: str | None
    started_at: datetime
    healthy_at: datetime | None
    ended_at: datetime | None
    #: the node a failed boot failed on, as its error named it (None: not named, or a boot
    #: recorded before schema 6)
    failed_rank: int | None = None
    failed_host: str | None = None
    #: a digest of the launchers the boot rendered (None: recorded before schema 9)
    rendering: str | None = None


class UnwrittenCell(_Record):
    """A cell measured whose write the ledger did not take (``add_cell_result``: its disk
    read-only or full, its server away): carried by the ``LedgerError`` that stopped the round,
    kept outside the ledger (``orchestrator.unrecorded``) and written once it takes writes."""

    experiment_id: int
    boot_id: int
    repeat: int
    result: CellResultRecord
    spec: CellSpec


class CellReading(NamedTuple):
    """One cell as a boot measured it: the boot, the repeat, what it measured, and the cell's
    definition it was measured under (``None``: recorded before schema 7, which kept of the
    definition only what the result itself says: category, concurrency, context)."""

    boot_id: int
    repeat: int
    result: CellResultRecord
    spec: CellSpec | None


class ChampionRecord(_Record):
    """The current champion of a cluster."""

    id: int
    cluster: str
    experiment_id: int
    config: Config
    objective: float
    since: datetime


class VerdictRecord(_Record):
    """The rule that decided an experiment, and its evidence."""

    status: Status
    rule: str
    reason: str
    stats: dict[str, object]


class DriftRecord(_Record):
    """A champion re-measurement and its drift from the champion's earlier measurements."""

    cluster: str
    experiment_id: int
    measurement: int
    before: float
    after: float
    drift_pct: float
    significant: bool
    created_at: datetime


class EventRecord(_Record):
    """Something done to the record outside a verdict (``ledger.models.EventRow``)."""

    id: int
    cluster: str
    kind: EventKind
    subject: str
    detail: dict[str, object]
    reason: str
    actor: str
    created_at: datetime


class HeldText(_Record):
    """A text held for an experiment's MLflow run until MLflow takes it (``HeldTextRow``)."""

    id: int
    experiment_id: int
    path: str
    text: str
