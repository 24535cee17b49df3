"""Where a round's boots went, counted in one place: each boot's use (``USES``: the config's
uses, then the boots the cluster cost), the nodes whose clocks were off in it, whether a busy
host disturbed its windows (``host_stalls.disturbed``), and what each decided experiment paid
and weighed (``measurements.BootCount``). The report, its MLflow summary and ``status`` read a
round's boots here, so they say the same numbers of the same ledger (``RoundBoots.tally``).

A boot is the round's when it started within it (its cluster's boots from the round's start to
its end, or now): the champion's re-measurements are the round's boots, though no experiment's
row counts them (they are filed under the champion's experiment, after its verdict).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from cluster.stall import DISTURBED_FRACTION
from knobs.records import CellResultRecord
from knobs.vocabulary import INFRASTRUCTURE, BootRole, BootStatus, Kind, State
from ledger import BootRecord, ExperimentRecord, Ledger, RoundRecord
from orchestrator import host_stalls
from orchestrator.measurements import BootCount
from orchestrator.verdict import slow_ranks

#: Where a boot's time went (the report's categories), in the order the plot stacks them: the
#: config's uses, then the boots the cluster cost (a boot that failed for the config's reasons,
#: one that failed for the infrastructure's, one measured with a node's clocks off: set aside).
USES = (
    "baseline",
    "candidate",
    "confirmation",
    "champion re-measure",
    "failed: the config's",
    "failed: the infrastructure's",
    "clocks off: set aside",
)
#: The uses that are the infrastructure's, never the config's.
INFRASTRUCTURE_USES = ("failed: the infrastructure's", "clocks off: set aside")


@dataclass(frozen=True)
class RoundBoot:
    """One boot of a round, as its counts see it."""

    boot: BootRecord
    #: one of ``USES``
    use: str
    #: the nodes whose clocks were off in its cells (its use then ``clocks off: set aside``)
    slow: frozenset[int]
    #: its clocks right, but its hosts' stalls may have moved its objective by more than
    #: ``stall.DISTURBED_FRACTION`` of it (``host_stalls.disturbed``): kept, its verdict's
    #: error widened by what the stalls may have cost it
    disturbed: bool


@dataclass(frozen=True)
class RoundTally:
    """A round's boots in numbers: every boot it paid (failed ones and the champion's
    re-measurements too), the measurements its verdicts weighed (its decided experiments'
    ``BootCount.measurements``: the report's ``measurements`` column), and the boots a busy
    host disturbed."""

    round: int
    boots: int
    failed: int
    #: the boots that measured the champion again (``BootRole.REMEASURE``)
    remeasures: int
    measurements: int
    disturbed: int

    def words(self) -> str:
        """``8 boot(s) paid (2 re-measured the champion, 1 failed), 6 measurement(s) weighed by
        its verdicts``."""
        some = [
            f"{self.remeasures} re-measured the champion" if self.remeasures else "",
            f"{self.failed} failed" if self.failed else "",
        ]
        of = ", ".join(s for s in some if s)
        return (
            f"{self.boots} boot(s) paid{f' ({of})' if of else ''}, {self.measurements} "
            "measurement(s) weighed by its verdicts"
        )

    def disturbed_words(self) -> str | None:
        """What a busy host did to the round's boots (``None``: nothing)."""
        if not self.disturbed:
            return None
        return (
            f"{self.disturbed} boot(s) measured in windows a busy host disturbed (its stalls may "
            f"have moved the objective by more than {DISTURBED_FRACTION:.0%}): kept, their "
            "verdicts' error widened by what the stalls may have cost them"
        )

    def as_json(self) -> dict[str, int]:
        """For ``status --json`` (the names of the round's MLflow summary)."""
        return {
            "round": self.round,
            "boots": self.boots,
            "failed_boots": self.failed,
            "remeasures": self.remeasures,
            "measurements": self.measurements,
            "disturbed_boots": self.disturbed,
        }


@dataclass(frozen=True)
class RoundBoots:
    """A round's boots, in boot order, and each decided experiment's ``BootCount`` by its id."""

    round: RoundRecord
    boots: list[RoundBoot]
    counts: dict[int, BootCount]

    @classmethod
    def read(
        cls,
        ledger: Ledger,
        rnd: RoundRecord,
        min_matmul_rate: float,
        every: Sequence[ExperimentRecord] | None = None,
    ) -> RoundBoots:
        """Round ``rnd``'s boots; ``every``: its experiments (read when not given). A boot is
        its experiment's kind's, decided or not: the baseline's first boot, cut short, is the
        baseline's."""
        if every is None:
            every = ledger.experiments(round_id=rnd.id)
        end_of_round = rnd.finished_at or datetime.now(UTC)
        slow: dict[int, set[int]] = {}  # boot → the nodes whose clocks were off in its cells
        by_boot: dict[int, list[CellResultRecord]] = {}
        for cells in ledger.cluster_cell_results(rnd.cluster).values():
            for r in cells:
                by_boot.setdefault(r.boot_id, []).append(r.result)
                ranks = slow_ranks([r.result], min_matmul_rate)
                if ranks:
                    slow.setdefault(r.boot_id, set()).update(ranks)
        kinds = {e.id: e for e in every}
        boots = []
        for boot in ledger.boots_since(rnd.cluster, rnd.started_at):
            if boot.started_at > end_of_round:
                break
            boots.append(
                RoundBoot(
                    boot=boot,
                    use=_use(boot, kinds.get(boot.experiment_id), slow),
                    slow=frozenset(slow.get(boot.id, ())),
                    disturbed=boot.id not in slow
                    and host_stalls.disturbed(by_boot.get(boot.id, [])),
                )
            )
        counts = {
            e.id: BootCount.of(e, ledger.boots(e.id), ledger.verdict(e.id))
            for e in every
            if e.state == State.DECIDED and e.status
        }
        return cls(rnd, boots, counts)

    def tally(self) -> RoundTally:
        """The round's boots in numbers."""
        return RoundTally(
            round=self.round.id,
            boots=len(self.boots),
            failed=sum(1 for b in self.boots if b.boot.status == BootStatus.FAILED),
            remeasures=sum(1 for b in self.boots if b.use == "champion re-measure"),
            measurements=sum(c.measurements for c in self.counts.values()),
            disturbed=sum(1 for b in self.boots if b.disturbed),
        )


def _use(boot: BootRecord, e: ExperimentRecord | None, slow: Mapping[int, set[int]]) -> str:
    if boot.status == BootStatus.FAILED:
        infrastructure = boot.failure_class in INFRASTRUCTURE
        return "failed: the infrastructure's" if infrastructure else "failed: the config's"
    if boot.id in slow:
        return "clocks off: set aside"
    if boot.role == BootRole.REMEASURE:
        return "champion re-measure"
    if boot.role == BootRole.CONFIRM:
        # the champion's (decided before it, or an earlier round's): the drift sentinel's
        # confirmation of a re-measure, not a candidate's confirmation
        decided = e is None or (e.decided_at is not None and e.decided_at <= boot.started_at)
        return "champion re-measure" if decided else "confirmation"
    return "baseline" if e is not None and e.kind == Kind.BASELINE else "candidate"
