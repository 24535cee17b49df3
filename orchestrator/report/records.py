"""What a round report holds (``data.collect`` reads it from the ledger, ``page`` and ``plots``
draw it): its rows, its knobs' rows, its stops, and the round in whole."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime

from agents.llm_fallback import Fallbacks
from knobs.config import Config
from knobs.spec import EffectPrior, Value
from knobs.vocabulary import Kind, Status
from ledger import RoundRecord
from orchestrator.champion_level import CellsChanged, LevelInForce
from orchestrator.compared_with import ComparedWith, Gain
from orchestrator.errors import OrchestrateError
from orchestrator.resumes import Resume
from orchestrator.round_boots import RoundTally


class NothingToReport(OrchestrateError):
    """The ledger has no round to report (or not the one asked for): exit 3, as any ID a
    command names that the ledger does not have (the ledger answered; 4 is one that failed)."""

    exit_code = 3


@dataclass(frozen=True)
class Point:
    """One decided experiment of the round, in order."""

    experiment: int
    label: str
    kind: Kind
    status: Status
    objective: float | None
    delta_pct: float | None
    #: the verdict's 95 % interval of the change, percent (``None``: no such evidence)
    interval: tuple[float, float] | None
    #: the boots it took to its verdict (``BootCount``: what the cluster paid), and how many
    #: of them failed
    boots: int
    rule: str
    knob: str | None
    value: Value | None
    #: how its boot failed (a crash's class, or one that did not reproduce)
    failure: str | None = None
    failed_boots: int = 0
    #: the proposal it came from (``None``: a baseline)
    proposal: int | None = None
    #: the measurements its verdict weighed (``BootCount``: a measurement resumed on a new
    #: boot is one of two boots)
    measurements: int = 0
    #: what its Δ is against: its champion's level in force then (``None``: no Δ measured)
    compared: ComparedWith | None = None


@dataclass(frozen=True)
class KnobRow:
    """A knob's value as the round measured it: every experiment that set it."""

    knob: str
    value: str
    effects: tuple[float, ...]
    #: the verdict of each of ``effects``, and of each experiment without one (a crash)
    statuses: tuple[Status, ...]
    crashes: int
    interval: tuple[float, float] | None
    boots: int
    verdicts: str
    prior: EffectPrior | None
    failed_boots: int = 0
    measurements: int = 0


@dataclass(frozen=True)
class Stop:
    """The round stopped short (``round-stopped``): when, its exit code and line, and when it
    went on (its cluster's next boot; ``None``: not yet)."""

    at: datetime
    exit_code: object
    line: str
    resumed_at: datetime | None


@dataclass
class ReportData:
    """Everything the report draws and lists."""

    profile: str
    cluster: str
    round: RoundRecord
    points: list[Point]
    #: the champion's objective after each point (the step line)
    champion_after: list[float | None]
    knobs: list[KnobRow]
    #: per experiment number, hours of boots by use (``round_boots.USES``)
    boot_hours: dict[int, dict[str, float]]
    boots_by_use: Counter[str]
    gpus: int
    llm_usd: float
    llm_calls: int
    launcher_diff: str
    start_config: Config | None
    champion_config: Config | None
    #: what stopped the round short, oldest first
    stops: list[Stop]
    #: its boots paid, measurements weighed and boots a busy host disturbed (``round_boots``,
    #: as ``status`` counts them)
    tally: RoundTally
    #: each time the round was taken up again, oldest first (``resumes``)
    resumes: list[Resume] = field(default_factory=list)
    #: the round's experiments done against its budget (``budget``), and its proposals vetoed
    #: (a person's, the queue's timeout's, the profile's), which it does not count
    done: int = 0
    vetoed: int = 0
    #: of those, the queue's timeout's: nobody judged their values, and they bar nothing
    vetoed_by_timeout: int = 0
    #: by node rank, the round's boots set aside with that node's clocks off
    clocks_off_by_node: Counter[int] = field(default_factory=Counter)
    #: the round's boots that failed for the infrastructure's reasons, by their class and
    #: their message's first line (which names the node)
    infrastructure_failures: Counter[tuple[str, str]] = field(default_factory=Counter)
    #: the round's last champion, where it is the cluster's and was measured again since the
    #: verdict its row records (``champion_level``)
    level: LevelInForce | None = None
    #: the cells the profile removed or added since the round's last champion was measured
    cells: CellsChanged | None = None
    #: the round's proposals an LLM was asked for, and those it fell back on, and why
    fallbacks: Fallbacks = field(default_factory=Fallbacks)
    #: the champion at the round's start and end by their levels in force, and its keeps' Δ
    gain: Gain | None = None
    #: a later round of the cluster ran since: the champion is said as this round left it
    past: bool = False

    @property
    def gpu_hours(self) -> float:
        return sum(sum(c.values()) for c in self.boot_hours.values()) * self.gpus

    @property
    def disturbed_boots(self) -> int:
        """The round's boots whose windows a busy host disturbed (``host_stalls.disturbed``):
        kept, their verdicts' error widened by what the stalls may have cost them."""
        return self.tally.disturbed
