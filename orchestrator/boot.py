"""One boot of a config: deploy on every node, the cells its measurement still lacks, and
teardown — each step committed to the ledger before the next.

No engine outlives a boot: whatever happens, every node's log is kept (it is the evidence)
and every node is stopped. A failure comes back as the ``NodeError`` it was, for the caller
to judge; this module decides nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import suppress

from cluster.errors import ClaimLost, NodeError, OwnershipLost
from knobs.config import Config
from knobs.vocabulary import (
    BOOT_CLAIM_LOST,
    BOOT_ERRORED,
    BOOT_INTERRUPTED,
    BOOT_TORN_DOWN,
    INFRASTRUCTURE,
    BootRole,
    BootStatus,
    State,
)
from ledger import BootRecord, ExperimentRecord, LeaseLost, Ledger, LedgerError
from orchestrator.crashpoints import crashpoint
from orchestrator.display import RoundDisplay
from orchestrator.evolution import fit
from orchestrator.interrupts import stop_if_unread, unbroken
from orchestrator.lease import lost_at, still_leased
from orchestrator.measurements import read_measurements
from orchestrator.profile import Profile
from orchestrator.rendering import digest
from orchestrator.runlog import RunLog
from orchestrator.testbed import StopsStarted, Testbed


class Booter:
    """Boots configs on the testbed and records each boot and cell in the ledger."""

    def __init__(
        self,
        profile: Profile,
        ledger: Ledger,
        testbed: Testbed,
        runlog: RunLog,
        display: RoundDisplay,
        *,
        guard: Callable[[], None] | None = None,
    ) -> None:
        self.profile = profile
        self.ledger = ledger
        self.testbed = testbed
        self.runlog = runlog
        self.display = display
        # the safe point before every boot: raises when the cluster is no longer ours (#17)
        self.guard = guard or (lambda: None)
        #: where the boot under way is (``deploying``, ``cell 2 of 3 (…)``), for a line
        self._at = "its deploy"

    def measure(
        self, e: ExperimentRecord, run_id: str | None, *, role: BootRole, measurement: int | None
    ) -> NodeError | None:
        """One boot of ``e``'s config: deploy, the cells its measurement still lacks, teardown.
        The failure, if the boot or the bench failed.

        Raises:
            OwnershipLost: the guard found the cluster no longer ours, before the boot or
                before its teardown, or a cell stopped the moment the lease or a node's claim
                was found another's (``Ownership.gone``): nothing was recorded; a boot under
                way is neither torn down nor ended: its engines and the boot's record are the
                new holder's.
            LeaseLost: a write found the lease another's (``Ledger.fence``): nothing was
                recorded, nothing torn down.
            Ended: the reader of the command's output went away (``stop_if_unread``):
                nothing started, every earlier boot torn down and recorded.
        """
        self.guard()
        stop_if_unread()  # nobody reads the round any more: no boot is paid for nothing
        deciding = e.state != State.DECIDED  # the champion's re-measurements boot a decided one
        if deciding:
            self.ledger.set_state(e.id, State.DEPLOYING)
        # recorded under an earlier profile: booted as this one renders it, a knob it lacks
        # from the champion it was proposed against (``evolution``)
        config = fit(self.profile.space, self.ledger, e).config
        boot = self.ledger.start_boot(
            e.id, config, role=role, measurement=measurement, rendering=digest(self.profile, config)
        )
        crashpoint("boot.started")
        failure: NodeError | None = None
        try:
            self._serve(e, run_id, boot, config, role=role, deciding=deciding)
        except NodeError as err:
            failure = err
        except BaseException as stop:
            # an interrupt (Ctrl-C, SIGTERM) or an error of ours: the engines torn down and the
            # boot ended now, as a resume would end it, so that no GPU-hour is counted to a boot
            # nothing runs for until the resume; a signal meanwhile waits for both
            with unbroken():
                try:
                    if self._tear_down(e, run_id, boot.id) is None:
                        self._ended_cut_short(boot.id, stop)
                except OwnershipLost as lost:
                    if isinstance(stop, OwnershipLost):
                        raise lost from stop  # a cell stopped for it: the ledger's line
            raise
        with unbroken():  # a teardown that has begun finishes, and its boot is closed
            torn = self._tear_down(e, run_id, boot.id)
            failure = failure if torn is None else _blamed(failure, torn)
            if failure is not None:
                self.ledger.end_boot(
                    boot.id,
                    status=BootStatus.FAILED,
                    failure_class=failure.failure_class,
                    failure_detail=failure.message,
                    rank=failure.rank,
                    host=failure.host,
                )
                return failure
            self.ledger.end_boot(boot.id, status=BootStatus.DOWN)
            if deciding:
                self.ledger.set_state(e.id, State.MEASURED)
        crashpoint("measured")
        return None

    def _serve(
        self,
        e: ExperimentRecord,
        run_id: str | None,
        boot: BootRecord,
        config: Config,
        *,
        role: BootRole,
        deciding: bool,
    ) -> None:
        """Deploy ``config``, then bench the cells its measurement still lacks."""
        self.display.phase(f"deploying ({role})")
        self._at = "its deploy"
        launchers = self.testbed.deploy(config)
        self.ledger.end_boot(boot.id, status=BootStatus.UP)
        crashpoint("smoke.passed")
        self.runlog.launchers(e, run_id, launchers)
        if deciding:
            self.ledger.set_state(e.id, State.BENCHING)
        self._bench(e.id, boot.id, boot.measurement)

    def _tear_down(self, e: ExperimentRecord, run_id: str | None, boot_id: int) -> NodeError | None:
        """The end of a boot on the nodes: every node's log kept (the evidence), then every
        engine stopped, even when the logs could not be kept (MLflow and the ledger both away).
        The teardown's own failure, if a node could not be stopped.

        Raises:
            OwnershipLost: the cluster was lost meanwhile (this process suspended past its
                lease while another took the round over): the engines on the nodes, and their
                logs, are the new holder's, which closed this boot as it took over; nothing
                was kept or stopped.
            Whatever keeping the logs raised, once every engine was stopped (and the boot
                ended as cut short).
        """
        lost = self._lost()
        if lost is not None:
            raise self._lost_mid_boot(e, boot_id, lost)
        try:
            self.runlog.boot_logs(e, run_id, boot_id, self.testbed.logs())
        except BaseException as stop:
            if self._stop_all() is None:
                self._ended_cut_short(boot_id, stop)
            raise
        return self._stop_all()

    def _stop_all(self) -> NodeError | None:
        """Every engine stopped: the node's error if one could not be (every other was tried)."""
        self.display.phase("tearing down")
        try:
            self.testbed.stop_all()
        except NodeError as err:
            return err
        return None

    def _ended_cut_short(self, boot_id: int, stop: BaseException) -> None:
        """A boot torn down because something else stopped the round ends with what stopped it
        (``_stopped_by``: an interrupt, or an error of ours); a ledger that does not answer
        leaves it open for the resume to close. A teardown cut short would have left it open:
        engines may run, and the resume stops them (``stop_stale``)."""
        with suppress(LedgerError):
            self.ledger.end_boot(boot_id, status=BootStatus.DOWN, failure_detail=_stopped_by(stop))

    def _bench(self, experiment_id: int, boot_id: int, measurement: int) -> None:
        done = {
            c.cell
            for m in read_measurements(self.ledger, experiment_id, self.profile.cells)
            if m.index == measurement
            for c in m.cells
        }
        cells = self.profile.cells
        for i, cell in enumerate(cells, start=1):
            if cell.name in done:
                continue
            # a process woken after another took the cluster over measures no cell more
            still_leased(self.ledger)
            self.display.phase(f"cell {i} of {len(cells)}: {cell.name}")
            self._at = f"cell {i} of {len(cells)} ({cell.name})"
            self.ledger.add_cell_result(experiment_id, boot_id, self.testbed.bench(cell), spec=cell)
            crashpoint("cell.recorded")
        self._at = "its teardown, its cells done"

    def _lost_mid_boot(
        self, e: ExperimentRecord, boot_id: int, lost: OwnershipLost
    ) -> OwnershipLost:
        """What to raise for ``lost``, found at a boot's teardown. A node's claim lost with
        the lease still ours (``cluster down --force`` broke it and stopped the engines, or
        another orchestrator took the node): the engines are not this round's now, so its
        boot is ended here, as far as the ledger knows who did it, unless the one that broke
        the claim ended it first; the line says where the round was. A lease lost: nothing
        written (the new holder's), the ledger's line."""
        if not isinstance(lost, ClaimLost):
            return lost
        # nobody recorded breaking the claim, so nobody stops this boot's engines but this
        # round: exactly those it started, each checked its own (never the node's new holder's)
        stopped = self._stop_started() if lost.by is None else None
        detail = lost.by or lost.said
        if stopped:
            detail += f"; the engines it started were stopped ({stopped})"
        closed = False
        with suppress(LedgerError):  # a lease lost meanwhile too: fenced, nothing written
            closed = self.ledger.end_boot(
                boot_id,
                status=BootStatus.DOWN,
                failure_detail=BOOT_CLAIM_LOST + detail,
                if_open=True,
            )
            closed = closed or all(b.id != boot_id for b in self.ledger.open_boots())
        where = f"mid-boot, during {self._at} of experiment #{e.id}"
        return lost_at(lost, where, closed=closed, stopped=stopped)

    def _stop_started(self) -> str | None:
        """The engines this boot started stopped (``Testbed.stop_started``), in words
        (``node-0: stopped, node-1: stopped``); None where the lease was lost too (the engines
        are the new holder's, who takes the round over) or nothing was started."""
        if not isinstance(self.testbed, StopsStarted):
            return None  # no node runs its engines (a simulation)
        try:
            outcomes = self.testbed.stop_started()
        except (OwnershipLost, LeaseLost):
            return None
        names = {n.rank: n.name for n in self.profile.cluster.nodes}
        return ", ".join(f"{names.get(r, f'node-{r}')}: {how}" for r, how in outcomes.items())

    def _lost(self) -> OwnershipLost | None:
        """The guard's finding, if the cluster is no longer ours (the lease and the node
        claims, renewed now)."""
        try:
            self.guard()
        except OwnershipLost as e:
            return e
        return None

    def restore(self, champion: Config | None) -> None:
        """Boot the champion again after a candidate failed, when the profile asks for it."""
        if not self.profile.restore_champion or champion is None:
            return
        self.display.phase("restoring the champion")
        try:
            self.testbed.restore(champion)
        except NodeError as err:
            self.display.note(f"  the champion was not restored: {err.message}")

    def stop_stale(self, cluster: str) -> None:
        """A killed orchestrator may have left engines up: stop every node, close the boots."""
        stale = self.ledger.open_boots(cluster)
        if not stale:
            return
        self.display.phase("stopping engines left by an interrupted run")
        with unbroken():
            self.testbed.stop_all()
            for boot in stale:
                self.ledger.end_boot(
                    boot.id,
                    status=BootStatus.DOWN,
                    failure_class=None,
                    failure_detail=BOOT_INTERRUPTED,
                )


def _stopped_by(stop: BaseException) -> str:
    """The ``failure_detail`` of a boot a run's stop ended, its teardown done: an interrupt
    (Ctrl-C, a SIGTERM or SIGHUP taken as one) or an error of ours, with its first line."""
    if not isinstance(stop, Exception):
        return BOOT_TORN_DOWN
    said = str(stop).strip().splitlines()
    return BOOT_ERRORED + (said[0] if said else type(stop).__name__)


def _blamed(failure: NodeError | None, teardown: NodeError) -> NodeError:
    """The failure a boot is recorded with when its teardown failed too: a node lost by then
    (the infrastructure's) explains a boot or a bench that failed on it, whatever class that
    failure was given; otherwise the first failure stands."""
    if failure is None:
        return teardown
    if teardown.failure_class not in INFRASTRUCTURE or failure.failure_class in INFRASTRUCTURE:
        return failure
    return NodeError(  # the first failure stays in the evidence
        f"{teardown.message}; before it, the boot had failed: {failure.failure_class}: "
        f"{failure.message}",
        failure_class=teardown.failure_class,
        rank=teardown.rank,
        host=teardown.host,
        command=teardown.command,
        returncode=teardown.returncode,
        stderr_tail=teardown.stderr_tail,
        log_tail=failure.log_tail or teardown.log_tail,
    )
