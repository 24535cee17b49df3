"""A host too busy to measure on: the round stops rather than spend its budget there.

A change every measurement of which a busy host disturbed (``host_stalls.every_disturbed``:
its stalls may have moved each boot's objective by more than ``stall.DISTURBED_FRACTION``)
measured the host as much as the config. Its verdict cannot keep or discard on that reading
(``host_stalls.HostError``), so it most often ends ``inconclusive`` at its boot cap: a few
boots for nothing, and the next change, on a host still busy, the same, all night. After
``verdict.busy_host_stop`` such changes left undecided in a row (``busy_run``) the round stops
as a node whose clocks stay off stops it (``faults.ClocksOff``): exit 5 (``BusyHost``), its
verdicts committed and the stop recorded by the round (``stops.record_stop``: ``status``, the
report and the resume say it, and whose host stalled: the client's, the machine that runs
orchestrate, or the engine's node's), nothing barred, for the same command to resume once the
host is quiet. The run must reach into the current sitting (``unjudged.sitting_start``): a
resume tries one change at least before it stops again.

What the run counts is what the stop is for: changes a busy host left *undecided*. A change
with no measurement (a veto, a crash, a closure) neither counts nor ends the run; nor does one
decided although a busy host disturbed every measurement of it (a keep or a discard that held
at the least or most favourable reading the stalls allow: the host made no decision impossible
there, but nor was it quiet); a change with one measurement the host left undisturbed ends it.

Such a change left undecided (``held``) judged nothing of its value: it bars nothing and is no
look at it (``looks_at``: the looks a later one counts; ``priors`` learn nothing from it). It
is held (not proposed again) for the rest of the sitting that measured it, so a host still
busy is not asked the same question at once, and it may be proposed again after a resume or
in a later round (``history``), as a veto of the queue's timeout is (``unjudged.timed_out``).

Ordinary rounds on a loaded machine do not trip it: one disturbed boot in a change's verdict,
a change partly disturbed, or fewer than ``busy_host_stop`` (3 by default) such changes in a
row leave the round going.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cluster import stall
from knobs.records import CellSpec
from knobs.vocabulary import Kind, State, Status
from ledger import ExperimentRecord, Ledger, RoundRecord
from orchestrator import knob_renames
from orchestrator.errors import OrchestrateError
from orchestrator.evolution import Lineage
from orchestrator.host_stalls import boot_error, every_disturbed
from orchestrator.measurements import Measurement, read_measurements
from orchestrator.profile import Profile
from orchestrator.unjudged import sitting_start, this_sitting

#: who a stop names for the client's stalls (the bench client runs in orchestrate's process)
CLIENT = "client"


class BusyHost(OrchestrateError):
    """``verdict.busy_host_stop`` changes in a row (``experiments``) measured a busy host, not
    the config: the round stops (exit 5) with their verdicts recorded and nothing barred, for
    the same command to resume once the host is quiet. ``hosts``: whose host it was (``CLIENT``,
    the machine that runs orchestrate, and/or the engine's node, ``node-0``)."""

    exit_code = 5

    def __init__(
        self, message: str, *, experiments: Sequence[int], hosts: Sequence[str] = ()
    ) -> None:
        super().__init__(message)
        self.experiments = list(experiments)
        self.hosts = list(hosts)


def _decided_measurements(
    ledger: Ledger, e: ExperimentRecord, cells: Sequence[CellSpec]
) -> list[Measurement]:
    """Decided ``e``'s complete measurements up to its decision (a kept change's later boots
    as champion are not its verdict's)."""
    at = e.decided_at
    return [
        m
        for m in read_measurements(ledger, e.id, cells)
        if m.complete and m.boots and (at is None or m.boots[0][1] <= at)
    ]


def measured_errors(ledger: Ledger, e: ExperimentRecord, cells: Sequence[CellSpec]) -> list[float]:
    """What the hosts' stalls may have cost each of decided ``e``'s complete measurements up
    to its decision (``host_stalls.boot_error``)."""
    return [boot_error(m.cells) for m in _decided_measurements(ledger, e, cells)]


def held(ledger: Ledger, e: ExperimentRecord, cells: Sequence[CellSpec]) -> bool:
    """Whether decided change ``e`` was left undecided (``inconclusive``) on measurements a
    busy host disturbed every one of: it judged nothing of its value (see the module)."""
    return (
        e.kind == Kind.CANDIDATE
        and e.status == Status.INCONCLUSIVE
        and every_disturbed(measured_errors(ledger, e, cells))
    )


def looks_at(profile: Profile, ledger: Ledger, config_key: str, champion_key: str) -> list[int]:
    """The looks of ``profile``'s cluster at config ``config_key`` as a change of champion
    ``champion_key``, both keys as the profile has them now, oldest first: its decided changes
    (a person's veto is no look: nothing was measured) whose config and champion, fitted to
    the profile (``evolution.Lineage``: a knob renamed since, ``knob_renames``, gained or
    lost), have those keys; less those a busy host left undecided (``held``): they measured
    the host, not the value. A look recorded under a knob's old name is a look at the knob.

    Raises:
        LedgerError: the ledger failed.
    """
    cluster = profile.cluster.name
    experiments = knob_renames.experiments(profile.space, ledger, cluster=cluster)
    lineage = Lineage.read(profile.space, ledger, cluster, experiments)
    return [
        e.id
        for e in experiments
        if e.kind == Kind.CANDIDATE
        and e.status is not None
        and e.status != Status.VETOED
        and e.champion_key == champion_key  # fitted now (``knob_renames.experiments``)
        and lineage.fit(e).config.key == config_key
        and not held(ledger, e, profile.cells)
    ]


@dataclass(frozen=True)
class Stalled:
    """A change in a busy run: the most the stalls may have moved a measurement's objective,
    and the seconds its measurements' windows stalled on each side, of how many."""

    experiment: ExperimentRecord
    error: float
    client_s: float
    engine_s: float
    window_s: float


def busy_run(ledger: Ledger, rnd: RoundRecord, cells: Sequence[CellSpec]) -> list[Stalled]:
    """Round ``rnd``'s latest decided changes a busy host left undecided (``held``), newest
    first, back to the latest one it left a measurement undisturbed in. A change with no
    measurement, or one decided although every measurement of it was disturbed, neither
    counts nor ends the run (see the module)."""
    decided = [
        e
        for e in ledger.experiments(round_id=rnd.id)
        if e.kind == Kind.CANDIDATE and e.state == State.DECIDED and e.decided_at is not None
    ]
    run: list[Stalled] = []
    for e in sorted(decided, key=lambda x: (x.decided_at, x.id), reverse=True):
        measurements = _decided_measurements(ledger, e, cells)
        errors = [boot_error(m.cells) for m in measurements]
        if not errors:
            continue
        if not every_disturbed(errors):
            break
        if e.status != Status.INCONCLUSIVE:  # decided all the same: no decision was impossible
            continue
        windows = [c for m in measurements for c in m.cells]
        run.append(
            Stalled(
                e,
                max(errors),
                sum(c.client_stall_s for c in windows),
                sum(c.engine_stall_s for c in windows),
                sum(c.duration for c in windows),
            )
        )
    return run


def whose(run: Sequence[Stalled], engine: str, at: str) -> tuple[list[str], str, str, str]:
    """Whose host stalled the ``run``'s windows: the names (``CLIENT``, ``engine``: the engine's
    node, at address ``at``, whose metrics report its host's stalls), the seconds each stalled
    in words (as a cell's notice says them), which host that is and where to look. A side is
    named where its stalls alone would have disturbed the windows
    (``stall.DISTURBED_FRACTION``), else the one that stalled more."""
    client = sum(s.client_s for s in run)
    engine_s = sum(s.engine_s for s in run)
    windows = sum(s.window_s for s in run)
    named = [
        who
        for who, seconds in ((CLIENT, client), (engine, engine_s))
        if stall.disturbed(seconds, windows)
    ] or [CLIENT if client >= engine_s else engine]
    hosts = {
        CLIENT: ("this machine (the client: it runs orchestrate and its bench)", "this machine"),
        engine: (f"the engine's host, {engine} ({at})", f"{engine} ({at})"),
    }
    said = f"client {client:.2f}s, engine {engine_s:.2f}s on {engine}"
    who = " and ".join(hosts[n][0] for n in named)
    where = " and ".join(hosts[n][1] for n in named)
    return named, said, who, where


def check(
    ledger: Ledger,
    rnd: RoundRecord,
    cells: Sequence[CellSpec],
    stop_after: int,
    *,
    engine: str,
    at: str,
) -> None:
    """Before round ``rnd`` proposes its next change: stop it when its last ``stop_after``
    decided changes in a row a busy host left undecided (``busy_run``), the latest of them in
    this sitting. ``engine``: the node whose engine the bench measures (the head), at address
    ``at``, named when its host stalled.

    Raises:
        BusyHost: they did.
    """
    run = busy_run(ledger, rnd, cells)
    if len(run) < stop_after or not this_sitting(
        run[0].experiment, rnd, sitting_start(ledger, rnd)
    ):
        return
    ids = ", ".join(f"#{s.experiment.id}" for s in reversed(run))
    worst = max(s.error for s in run)
    hosts, said, who, where = whose(run, engine, at)
    raise BusyHost(
        f"a busy host disturbed every measurement of the last {len(run)} changes in a row "
        f"(experiments {ids}; its stalls may have moved their objectives up to "
        f"±{100 * worst:.0f}%; their windows stalled {said}) and left each undecided: the "
        f"busy host was {who}; they measured the host, not the changes, and the next would "
        "too; their verdicts are recorded and nothing was barred (each may be proposed again): "
        f"find what else runs on {where} (another round, a build, a benchmark) and run the "
        "same command to resume once it is quiet",
        experiments=[s.experiment.id for s in reversed(run)],
        hosts=hosts,
    )
