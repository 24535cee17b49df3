"""What the round does when a boot fails for the infrastructure's reasons (``INFRASTRUCTURE``:
a node unreachable, auth, an upload, a worker missing from the rendezvous, stuck clocks): it
is never a verdict on the config. The boot is taken again after ``policy``'s backoff; when the
retries are spent the round stops (exit 5), the experiment undecided and nothing barred, for
the same command to resume once the node is back. A champion that booted before and now
fails its boots in a row for what would be a configuration's reasons stops the round the same
way (``champion_failed``): its config did not change, the cluster did — unless the profile
changed it (a knob lost or gained since it was measured, and it never came up so:
``evolution.refit_blame``), which stops the round as a bad profile does (exit 3). So does a
node whose clocks stay off through the boots' power cycles (``clocks_checked``): each boot with
clocks off is set aside and taken again (``policy``), and a run of them measures the node, not
a config.

A ledger or an MLflow that does not answer is waited out by ``orchestrator.outages``; what
stopped a round short is recorded for the morning by ``orchestrator.stops``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from cluster.errors import NodeError
from knobs.vocabulary import INFRASTRUCTURE, BootStatus, Kind
from ledger import ExperimentRecord, Ledger, RoundRecord
from orchestrator import policy
from orchestrator.display import RoundDisplay
from orchestrator.errors import OrchestrateError
from orchestrator.evolution import refit_blame
from orchestrator.measurements import clocks_off_counts, clocks_off_in_a_row
from orchestrator.profile import Profile

#: What the same command waits for, by the failure's class, in a stop's line: the node back,
#: unless the class names what else must change first.
_RESUME_ONCE: dict[str, str] = {
    "port_in_use": "the cluster's port is free on the node (or the profile gives the cluster "
    "other ports)",
    "disk_full": "the node's disk has room",
    "clocks_stuck": "the node's clocks are sound",
    "gpu_fault": "the node's GPU is sound",
}
#: The classes a change of its own can bring on, so that setting the change aside is a way on:
#: weights that no node can fetch (``network``), or that no disk holds (``disk_full``). A port
#: taken, a node away, a worker missing fail every change alike: a veto would bar a value for
#: the node's fault and help nothing.
_CHANGE_OF_ITS_OWN = frozenset({"network", "disk_full"})


class InfrastructureFault(OrchestrateError):
    """A node kept failing for the infrastructure's reasons (unreachable, auth, an upload, a
    worker missing from the rendezvous, stuck clocks): the round stops, the experiment is left
    undecided (``experiment``; ``None``: none was under way), and the same command resumes it
    once the node is back."""

    exit_code = 5

    def __init__(self, message: str, *, failure: NodeError, experiment: int | None) -> None:
        super().__init__(message)
        self.failure = failure
        self.experiment = experiment


class ChampionFailing(InfrastructureFault):
    """The champion, which booted before, failed its boots in a row for what would be a
    configuration's reasons: its config did not change, the cluster did. The round stops as
    for a node away (exit 5), the change it was booted for undecided and nothing barred."""


class RefitChampionFailing(OrchestrateError):
    """The champion, which booted before, failed its boots in a row for a config's reasons as
    the profile renders it now, and never came up so: the profile lost a knob it had (the
    engine runs at its own default) or gained one (its default). The profile's, not the
    cluster's (exit 3): the round stops, the change under way undecided and nothing barred,
    for the same command to resume once the profile or its launcher says the value again."""

    exit_code = 3

    def __init__(
        self,
        message: str,
        *,
        failure: NodeError,
        experiment: int | None,
        removed: dict[str, object],
        added: dict[str, object],
    ) -> None:
        super().__init__(message)
        self.failure = failure
        self.experiment = experiment
        self.removed = removed
        self.added = added


class ClocksOff(InfrastructureFault):
    """A node's clocks were off in the cluster's measurements in a row
    (``policy.clocks_off_stop``), the power cycle before each boot notwithstanding: every boot after
    would measure the node, not a config. The round stops (exit 5), the change under way
    undecided and nothing barred."""


class InfrastructureFaults:
    """Waits out, or gives up on, a node that failed a boot for the infrastructure's reasons."""

    def __init__(
        self,
        profile: Profile,
        ledger: Ledger,
        display: RoundDisplay,
        sleep: Callable[[float], None],
    ) -> None:
        self.profile = profile
        self.ledger = ledger
        self.display = display
        self.sleep = sleep  # the backoff before a boot is taken again (a test's clock)

    def wait_or_stop(
        self, e: ExperimentRecord, err: NodeError, *, booted: ExperimentRecord | None = None
    ) -> None:
        """A boot for ``e``'s verdict failed for the infrastructure's reasons (a boot of ``e``,
        or of ``booted``: the champion re-measured for it): wait before the next try (the
        policy's backoff), or stop the round with ``e`` undecided.

        Raises:
            InfrastructureFault: the retries are spent.
        """
        failures = 0
        for boot in reversed(self.ledger.boots((booted or e).id)):
            if boot.status != BootStatus.FAILED or boot.failure_class not in INFRASTRUCTURE:
                break
            failures += 1
        delay = policy.infrastructure_retry(self.profile.verdict, failures)
        where = f"node {err.rank}" if err.rank is not None else "a node"
        if err.host:
            where += f" ({err.host})"
        if delay is None:
            # a change of its own that only fails this way (weights no node can fetch) can be
            # set aside by a person; the champion's boots, or the baseline's, cannot, nor a
            # fault that fails every change alike
            aside = (
                f", or `orchestrate experiments veto {e.id} --reason …` to set the change aside "
                "and go on with the next"
                if e.kind == Kind.CANDIDATE
                and booted is None
                and err.failure_class in _CHANGE_OF_ITS_OWN
                else ""
            )
            once = _RESUME_ONCE.get(err.failure_class or "", "the node is back")
            raise InfrastructureFault(
                f"{where}: {err.failure_class} {failures} times in a row ({err.message}); "
                f"experiment #{e.id} is left undecided and nothing was barred: run the same "
                f"command to resume once {once}{aside}",
                failure=err,
                experiment=e.id,
            )
        self.display.note(
            f"  {where}: {err.failure_class} ({err.message}); not the config's fault: "
            f"booting again in {delay:g}s"
        )
        self.sleep(delay)

    def clocks_checked(self, rnd: RoundRecord, e: ExperimentRecord) -> None:
        """After a boot for ``e``'s verdict measured (``e``'s or the champion's): stop the round
        if the clocks were off in the cluster's last measurements of this round
        (``measurements.clocks_off_in_a_row``) in a run that the rate its clocks were off
        before would make by chance too rarely (``policy.clocks_off_stop``).

        Raises:
            ClocksOff: they were.
        """
        gates = self.profile.gates
        cells = self.profile.cells
        cluster = self.profile.cluster.name
        off = clocks_off_in_a_row(
            self.ledger, cluster, rnd.started_at, cells, gates.min_matmul_rate
        )
        if len(off) < policy.CLOCKS_OFF_IN_A_ROW:
            return
        # the run is weighed against the cluster's measurements before it
        total, counts = clocks_off_counts(self.ledger, cluster, cells, gates.min_matmul_rate)
        for _, slow in off:
            for rank in slow:
                counts[rank] = max(0, counts.get(rank, 0) - 1)
        history = policy.ClocksHistory(
            measurements=max(0, total - len(off)),
            off=counts,
            nodes=[n.rank for n in self.profile.cluster.nodes],
        )
        stop = policy.clocks_off_stop([slow for _, slow in off], history)
        if stop is None:
            return
        ranks, run = stop
        names = {n.rank: n.name for n in self.profile.cluster.nodes}
        nodes = ", ".join(names.get(r, f"node {r}") for r in ranks)
        experiments = ", ".join(f"#{x}" for x in sorted({x for x, _ in off[:run]}))
        message = (
            f"clocks off on {nodes} in the last {run} measurements in a row "
            f"(experiments {experiments}; matmul rate under {gates.min_matmul_rate:g}), "
            "though each boot's preflight power-cycles a node whose clocks are stuck when the "
            "profile has a recover_command"
        )
        raise ClocksOff(
            f"{message}: every boot would measure the node, not a config; experiment #{e.id} "
            "is left undecided and nothing was barred: run the same command once the node's "
            "clocks hold (a power cycle, its cooling)",
            failure=NodeError(message, failure_class="clocks_stuck", rank=ranks[0]),
            experiment=e.id,
        )

    def champion_failed(
        self, e: ExperimentRecord | None, err: NodeError, *, champion: ExperimentRecord
    ) -> None:
        """The champion (``champion``), booted for ``e``'s verdict (``None``: re-measured on
        its schedule, for no change), failed for a configuration's class (``err``): boot it
        once more, or, when it failed so in a row (``policy.champion_failure``), stop the
        round with ``e`` undecided.

        Raises:
            ChampionFailing: the champion's failure reproduced.
            RefitChampionFailing: … and it never came up as the profile renders it now, which
                lost or gained a knob of its config since (``evolution.refit_blame``).
        """
        failed: list[str] = []
        for boot in reversed(self.ledger.boots(champion.id)):
            if boot.status != BootStatus.FAILED:
                break
            if boot.failure_class not in INFRASTRUCTURE:
                failed.append(str(boot.failure_class))
        if not policy.champion_failure(len(failed)):
            self.display.note(
                f"  the champion (experiment #{champion.id}), which booted before, failed "
                f"({err.failure_class}: {err.message}): booting it once more"
            )
            return
        left = "no change" if e is None else f"experiment #{e.id}"
        blame = refit_blame(self.profile, self.ledger, champion)
        if blame is not None:
            raise RefitChampionFailing(
                blame.line(
                    f"the champion (experiment #{champion.id}) failed {len(failed)} times in a "
                    f"row ({', '.join(reversed(failed))}; {err.message})",
                    f"{left} is left undecided and nothing was barred",
                ),
                failure=err,
                experiment=None if e is None else e.id,
                removed=dict(blame.removed),
                added=dict(blame.added),
            )
        raise ChampionFailing(
            f"the champion (experiment #{champion.id}), which booted before, failed "
            f"{len(failed)} times in a row ({', '.join(reversed(failed))}; {err.message}): the "
            f"cluster is failing, not the changes tried on it; {left} is left undecided and "
            "nothing was barred: run the same command once the cluster boots its champion again",
            failure=err,
            experiment=None if e is None else e.id,
        )


def failed_by_node(ledger: Ledger, cluster: str) -> dict[int | None, Counter[str]]:
    """The boots of ``cluster`` that failed for the infrastructure's reasons, by the node they
    failed on (``None``: the ledger names none) and class (``orchestrate status``)."""
    failed: dict[int | None, Counter[str]] = {}
    for boots in ledger.cluster_boots(cluster).values():
        for b in boots:
            if b.status == BootStatus.FAILED and b.failure_class in INFRASTRUCTURE:
                failed.setdefault(b.failed_rank, Counter())[b.failure_class] += 1
    return failed
