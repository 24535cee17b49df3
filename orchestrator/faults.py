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

A ledger that does not answer (a PostgreSQL restart at night) is waited out too
(``through_ledger_outages``): the round is built afresh and resumes from its last committed
step, as the same command would after a kill. So are a ledger server and an MLflow that do not
answer when the round's command opens them (``waiting_for_ledger``, ``waiting_for_mlflow``): a
night a timer starts while PostgreSQL or the tracking server restarts is not lost. (Mid-round,
MLflow away is ``orchestrator.mirror``'s.)
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from contextlib import suppress
from typing import TypeVar

from cluster.errors import NodeError
from knobs.vocabulary import INFRASTRUCTURE, BootStatus, EventKind, Kind
from ledger import (
    EventRecord,
    ExperimentRecord,
    Ledger,
    LedgerError,
    MlflowSinkError,
    RoundRecord,
)
from ledger.redact import Redactor
from orchestrator import policy
from orchestrator.display import RoundDisplay
from orchestrator.errors import INTERRUPTED, OrchestrateError
from orchestrator.evolution import refit_blame
from orchestrator.interrupts import ended_by
from orchestrator.measurements import clocks_off_counts, clocks_off_in_a_row
from orchestrator.profile import Profile
from orchestrator.timestamps import utc_minute

T = TypeVar("T")


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
            # set aside by a person; the champion's boots, or the baseline's, cannot
            aside = (
                f", or `orchestrate experiments veto {e.id} --reason …` to set the change aside "
                "and go on with the next"
                if e.kind == Kind.CANDIDATE and booted is None
                else ""
            )
            raise InfrastructureFault(
                f"{where}: {err.failure_class} {failures} times in a row ({err.message}); "
                f"experiment #{e.id} is left undecided and nothing was barred: run the same "
                f"command to resume once the node is back{aside}",
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


def through_ledger_outages(
    run: Callable[[], T],
    *,
    note: Callable[[str], None],
    sleep: Callable[[float], None] = time.sleep,
    waits: Sequence[float] = policy.LEDGER_WAITS,
) -> T:
    """``run()``, and again after a wait each time the ledger did not answer
    (``LedgerError.unreachable``): ``run`` builds the round afresh and runs it, so it resumes
    from the last step the ledger committed, as the same command would after a kill.

    Raises:
        LedgerError: the ledger refused what it was asked, or still did not answer after the
            last wait (the round stays open for the same command to resume).
    """
    return _waited(
        run,
        LedgerError,
        lambda message, wait: (
            f"the ledger did not answer ({message}); nothing it recorded is "
            f"lost: the round waits {wait:g}s and resumes from it"
        ),
        note,
        sleep,
        waits,
    )


def waiting_for_ledger(
    open_: Callable[[], T],
    *,
    url: str,
    reached_before: bool,
    note: Callable[[str], None],
    sleep: Callable[[float], None] = time.sleep,
    waits: Sequence[float] = policy.LEDGER_WAITS,
) -> T:
    """``open_()`` (the ledger at ``url``, opened as a round's command starts), and again after
    a wait each time a ledger server did not answer (``LedgerError.unreachable``), on the
    schedule of a ledger away mid-round — if this machine has ``reached_before`` that server
    (``contacts.ledger_reached``): a night a timer starts while PostgreSQL restarts is not
    lost. One never reached from here is taken for a URL that names nothing (a wrong host,
    port or address) and refused at once, as is a SQLite ledger that cannot be opened (a local
    file: a wrong path is far likelier than a disk that comes back).

    Raises:
        LedgerError: the ledger refused (a newer schema, a bad URL, a user, password or
            database its server does not know), is a SQLite file that could not be opened,
            is a server never reached from here that did not answer (at once), or still did
            not answer after the last wait.
    """
    if url.startswith("sqlite"):
        return open_()
    if not reached_before:
        try:
            return open_()
        except LedgerError as e:
            if not e.unreachable:
                raise
            raise LedgerError(
                f"{e.message}; this machine has never reached this ledger, so it is not waited "
                "for as an outage: check the ledger URL (ORCHESTRATE_LEDGER, else the "
                "profile's ledger_url) and that its server is up, then run the command again",
                url=e.url,
                unreachable=True,
            ) from None
    return _waited(
        open_,
        LedgerError,
        lambda message, wait: (
            f"the ledger did not answer ({message}); waiting {wait:g}s before trying again "
            "(Ctrl-C stops; the same command starts the round later)"
        ),
        note,
        sleep,
        waits,
    )


def waiting_for_mlflow(
    open_: Callable[[], T],
    *,
    reached_before: bool,
    note: Callable[[str], None],
    sleep: Callable[[float], None] = time.sleep,
    waits: Sequence[float] = policy.LEDGER_WAITS,
) -> T:
    """``open_()`` (MLflow, opened as a command starts), and again after a wait each time
    MLflow did not answer (``MlflowSinkError.unreachable``), on the ledger's schedule — if the
    ledger has ``reached_before`` (``mlflow_reached``): an MLflow that answered this ledger's
    rounds and does not answer now is away for a while. One that never answered it is taken
    for a tracking URI that names nothing (a wrong port, host or scheme) and refused at once,
    while the person who typed it is still there to read why.

    Raises:
        MlflowSinkError: MLflow is configured wrongly or refused (at once), never answered
            this ledger (at once), or still did not answer after the last wait.
    """
    if not reached_before:
        try:
            return open_()
        except MlflowSinkError as e:
            if not e.unreachable:
                raise
            raise MlflowSinkError(
                f"{e.message}; this ledger's rounds have never reached an MLflow, so it is "
                "not waited for as an outage: check the tracking URI (MLFLOW_TRACKING_URI, "
                "else the profile's mlflow_uri) and that its server is up, then run the "
                "command again",
                tracking_uri=e.tracking_uri,
                operation=e.operation,
                unreachable=True,
            ) from None
    return _waited(
        open_,
        MlflowSinkError,
        lambda message, wait: (
            f"MLflow did not answer ({message}); waiting {wait:g}s before trying again"
        ),
        note,
        sleep,
        waits,
    )


def mlflow_reached(ledger: Ledger, cluster: str) -> bool:
    """Whether MLflow ever answered a round of ``cluster`` in this ledger (a round gets its
    MLflow run as it starts): the evidence ``waiting_for_mlflow`` weighs a silent MLflow by."""
    return any(r.mlflow_run_id for r in ledger.rounds(cluster))


def _waited(
    run: Callable[[], T],
    away: type[LedgerError | MlflowSinkError],
    said: Callable[[str, float], str],
    note: Callable[[str], None],
    sleep: Callable[[float], None],
    waits: Sequence[float],
) -> T:
    """``run()``, again after each of ``waits`` while it raises ``away`` that did not answer
    (``unreachable``), each wait ``said`` in one line; the last try's error raised."""
    for wait in waits:
        try:
            return run()
        except away as e:
            if not e.unreachable:
                raise
            note(said(e.message, wait))
            sleep(wait)
    return run()


def record_stop(
    ledger: Ledger,
    cluster: str,
    round_id: int | None,
    err: OrchestrateError | KeyboardInterrupt,
) -> None:
    """What stopped round ``round_id`` short of its end (a node away, a champion that stopped
    booting, the lease lost, an interrupt), recorded for the morning (``round-stopped``): the
    line the command ended with went to a terminal or a timer's log; ``orchestrate status``
    and the resume show it from here. A node's failure names the node (``node``, with its
    ``failure_class``). ``round_id`` None: a round command stopped before any round began
    (``before_a_round``). A ledger that is itself what failed records nothing."""
    if isinstance(err, LedgerError):
        return
    detail: dict[str, object]
    if isinstance(err, KeyboardInterrupt):
        by = ended_by(err)
        code, line = INTERRUPTED, f"interrupted by {by}; run the same command again to resume"
        detail = {"error": by.split(" ")[0]}  # which signal, never the exception's class
    else:
        code, line, detail = err.exit_code, err.message, {"error": type(err).__name__}
        failure = err.failure if isinstance(err, InfrastructureFault) else err
        if isinstance(failure, NodeError) and failure.rank is not None:
            detail.update(node=f"node-{failure.rank}", failure_class=failure.failure_class)
    with suppress(LedgerError):
        ledger.add_event(
            cluster,
            EventKind.ROUND_STOPPED,
            subject="" if round_id is None else str(round_id),
            detail={**detail, "exit_code": code},
            reason=Redactor.from_environment().text(line),
        )


#: The exit code of a round stopped by its cap (``--max-hours``, ``--max-gpu-hours``): the
#: command did what it was asked, and the round stays open for the same command to go on.
CAPPED = 0


def record_cap(ledger: Ledger, cluster: str, round_id: int, cap: str, line: str) -> None:
    """Round ``round_id`` stopped by its cap ``cap`` (``max-hours``, ``max-gpu-hours``),
    recorded as any stop short is (``round-stopped``, exit ``CAPPED``) with the line the
    command ended with: ``status`` (and ``--json``), the report, the MLflow parent run's
    ``stops`` and the resume say the cap stopped it and how to go on."""
    ledger.add_event(
        cluster,
        EventKind.ROUND_STOPPED,
        subject=str(round_id),
        detail={"error": "RoundCapReached", "cap": cap, "exit_code": CAPPED},
        reason=line,
    )


def last_stop(ledger: Ledger, cluster: str, round_id: int) -> EventRecord | None:
    """The last time round ``round_id`` stopped short of its end (``record_stop``), if
    nothing has booted for it since (a resume under way, or one that went on, makes it old
    news)."""
    stops = [
        ev for ev in ledger.events(cluster, EventKind.ROUND_STOPPED) if ev.subject == str(round_id)
    ]
    if not stops:
        return None
    booted = [
        b.started_at for e in ledger.experiments(round_id=round_id) for b in ledger.boots(e.id)
    ]
    return None if any(t > stops[-1].created_at for t in booted) else stops[-1]


def said_stop(stop: EventRecord) -> str:
    """A stop (``last_stop``) in words: ``stopped at … UTC (exit N): the line``."""
    return (
        f"stopped at {utc_minute(stop.created_at)} "
        f"(exit {stop.detail.get('exit_code')}): {stop.reason}"
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
