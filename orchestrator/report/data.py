"""What a round report shows, read from the ledger (no drawing here): every experiment with its
verdict's evidence, the champion's path, per knob and value the measured effects, where the
boots and GPU-hours went (the infrastructure's share apart: boots that failed for a node's
reasons, boots set aside for a node's clocks), what stopped the round short and when it went on,
the LLM spend, and the champion's launcher against the one the round started from."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import replace
from datetime import UTC, datetime

from agents.llm_fallback import Fallbacks
from cluster.launcher import render_node
from knobs.config import Config
from knobs.errors import KnobError, ProfileError
from knobs.records import LlmUsage
from knobs.spec import Value, as_text, clipped
from knobs.vocabulary import BootRole, EventKind, Kind, ProposalStatus, State, Status
from ledger import ChampionRecord, ExperimentRecord, Ledger, RoundRecord
from orchestrator import budget, knob_renames, left_open, resumes, stalled_verdicts
from orchestrator.approval import TIMEOUT_BY
from orchestrator.cell_renames import resolved
from orchestrator.champion import ChampionEvidence
from orchestrator.champion_level import cells_changed, level_in_force
from orchestrator.compared_with import (
    compared_with,
    gain,
    level_in_force_then,
    level_then,
)
from orchestrator.display import describe
from orchestrator.evolution import fit_champion
from orchestrator.gpu_hours import cluster_gpus
from orchestrator.measurements import BootCount
from orchestrator.priors import knob_priors, measured
from orchestrator.profile import Profile
from orchestrator.report.diff import launcher_diff
from orchestrator.report.records import KnobRow, NothingToReport, Point, ReportData, Stop
from orchestrator.resumes import Resume
from orchestrator.round_boots import INFRASTRUCTURE_USES, RoundBoots
from orchestrator.settings import runtime_placeholders
from orchestrator.verdict import interval_pct

#: A two-sided 95 % interval, in standard errors.
Z95 = 1.96


def collect(profile: Profile, ledger: Ledger, round_id: int | None = None) -> ReportData:
    """The report's data for round ``round_id`` of the profile's cluster (default: the last).

    Raises:
        NothingToReport: no such round, or the ledger has none.
    """
    profile, _ = resolved(profile, ledger)  # a cell renamed: its readings its own
    cluster = profile.cluster.name
    rounds = ledger.rounds(cluster)
    if not rounds:
        raise NothingToReport(
            f"the ledger has no round of cluster {cluster}: run `orchestrate round` first"
        )
    chosen = [r for r in rounds if round_id is None or r.id == round_id]
    if not chosen:
        known = ", ".join(str(r.id) for r in rounds)
        raise NothingToReport(f"cluster {cluster} has no round {round_id} (it has {known})")
    rnd = chosen[-1]
    # a later round ran since: the page says this one as it ended, not what came after
    past = rnd.id != rounds[-1].id
    every = ledger.experiments(round_id=rnd.id)
    experiments = [e for e in every if e.state == State.DECIDED and e.status]
    compared = compared_with(profile, ledger, experiments)
    # fitted to the profile as it is now: a champion recorded before it gained a knob has the
    # knob's default (or its parent's value), one it lost is dropped (``evolution``), as the
    # round runs it; the launchers are compared so. A past round's champion is shown as the
    # ledger recorded it, as that round ran it.
    start, end = (
        None if c is None else fit_champion(profile.space, ledger, c).config
        for c in _champions(ledger, cluster, rnd)
    )
    recorded = _champions(ledger, cluster, rnd)[1]
    seen = RoundBoots.read(ledger, rnd, profile.gates.min_matmul_rate, every)
    # decided by an earlier release on a busy host's windows: the row says so (a keep stays)
    busy = stalled_verdicts.busy_decided(ledger, [(e, ledger.verdict(e.id)) for e in experiments])
    data = ReportData(
        profile=profile.name,
        cluster=cluster,
        round=rnd,
        points=[
            replace(_point(ledger, e, seen.counts[e.id], e.id in busy), compared=compared.get(e.id))
            # a stop an earlier release recorded `discard` and left open reads `inconclusive`
            for e in left_open.read(profile.verdict, ledger, experiments)
        ],
        champion_after=[],
        knobs=[],
        boot_hours={},
        boots_by_use=Counter(),
        gpus=cluster_gpus(profile),
        llm_usd=0.0,
        llm_calls=0,
        launcher_diff="",
        start_config=start,
        champion_config=recorded.config if past and recorded is not None else end,
        past=past,
        resumes=resumes.of_round(ledger, rnd),
        stops=[],
        tally=seen.tally(),
        done=budget.done(every),
    )
    data.stops = _stops(ledger, rnd, data.resumes)
    # each champion's level as it stood at the round's end, not as a later round measured it
    evidence, end_of_round = ChampionEvidence(profile, ledger), rnd.finished_at or datetime.now(UTC)
    held = tuple(
        None if c is None else level_then(evidence, c, end_of_round)
        for c in _champions(ledger, cluster, rnd)
    )
    data.gain = gain(ledger, (held[0], held[1]), experiments, compared)
    # the champion's row and the champion say its level in force, as results.tsv and status;
    # a past round's, its level at that round's end
    last = _champions(ledger, cluster, rnd)[1]
    if past:
        level = None if last is None else level_in_force_then(evidence, last, end_of_round)
    else:
        level = level_in_force(ChampionEvidence(profile, ledger))
    now = ledger.champion(cluster)
    if (
        not past
        and last is not None
        and now is not None
        and last.experiment_id == now.experiment_id
    ):
        data.cells = cells_changed(ChampionEvidence(profile, ledger))
    if level is not None and last is not None and last.experiment_id == level.experiment:
        data.level = level
        data.points = [
            p
            if p.experiment != level.experiment
            else replace(p, label=f"{p.label}; {level.row_words()}")
            for p in data.points
        ]
    data.champion_after = _champion_path(evidence, rnd, experiments)
    data.knobs = _knob_rows(profile, ledger, data.points, end_of_round)
    _boots(rnd, experiments, data, seen)
    proposals = ledger.proposals(round_id=rnd.id)
    for p in proposals:
        if p.status == ProposalStatus.VETOED:
            data.vetoed += 1
            data.vetoed_by_timeout += p.decided_by == TIMEOUT_BY
        usage = LlmUsage.from_notes(p.notes)
        if usage is not None:
            data.llm_usd += usage.cost_usd
            data.llm_calls += usage.requests
    data.fallbacks = Fallbacks.of(((p.source, p.notes) for p in proposals), round_id=rnd.id)
    data.launcher_diff = launcher_diff(profile, start, end)
    return data


def _point(ledger: Ledger, e: ExperimentRecord, boots: BootCount, busy: bool) -> Point:
    """``boots``: what it paid and weighed (``RoundBoots.counts``); ``busy``: decided by an
    earlier release on a busy host's windows (``stalled_verdicts``)."""
    verdict = ledger.verdict(e.id)
    interval = None if verdict is None else interval_pct(verdict.stats, Z95)
    assert e.status is not None
    return Point(
        experiment=e.id,
        label=describe(e) + (f"; {stalled_verdicts.WORDS}" if busy else ""),
        kind=e.kind,
        status=e.status,
        objective=e.objective if e.status not in (Status.CRASH, Status.VETOED) else None,
        delta_pct=e.delta_pct,
        interval=interval,
        boots=boots.boots,
        failed_boots=boots.failures,
        measurements=boots.measurements,
        rule=verdict.rule if verdict is not None else "",
        # a coupled move is a row of its own: ``a+b`` at ``v+w``
        knob=e.label,
        value=e.value
        if e.coupled_knob is None or e.value is None
        else f"{as_text(e.value)}+{as_text(e.coupled_value or '')}",
        failure=e.failure_class,
        proposal=e.proposal_id,
    )


def _champions(
    ledger: Ledger, cluster: str, rnd: RoundRecord
) -> tuple[ChampionRecord | None, ChampionRecord | None]:
    """The champion the round started from and the one it ended with."""
    history = ledger.champion_history(cluster)
    end_of_round = rnd.finished_at or datetime.now(UTC)
    before = [c for c in history if c.since <= rnd.started_at]
    during = [c for c in history if c.since <= end_of_round]
    start = before[-1] if before else (during[0] if during else None)
    end = during[-1] if during else None
    return start, end


def _champion_path(
    evidence: ChampionEvidence, rnd: RoundRecord, experiments: list[ExperimentRecord]
) -> list[float | None]:
    """The champion held as each experiment was decided (its step line), each at its level
    as it stood at the round's end (``level_then``), as the header reads it: not a level a
    later round measured."""
    ledger = evidence.ledger
    history = ledger.champion_history(evidence.cluster)
    end_of_round = rnd.finished_at or datetime.now(UTC)
    levels: dict[int, float] = {}
    path: list[float | None] = []
    for e in experiments:
        at = e.decided_at or rnd.started_at
        held = [c for c in history if c.since <= at]
        if not held:
            path.append(None)
            continue
        if held[-1].id not in levels:
            levels[held[-1].id] = level_then(evidence, held[-1], end_of_round).objective
        path.append(levels[held[-1].id])
    return path


def _knob_rows(
    profile: Profile, ledger: Ledger, points: list[Point], end_of_round: datetime
) -> list[KnobRow]:
    """Per knob and value, what the round measured (candidates only), with the prior in force
    for the knob at the round's end (the profile's, or what this cluster's measurements taught
    by then), a knob renamed since under its name now."""
    decided = [
        e
        for e in knob_renames.experiments(profile.space, ledger, cluster=profile.cluster.name)
        if e.decided_at is None or e.decided_at <= end_of_round
    ]
    priors = knob_priors(profile, measured(ledger, decided, profile.cells))
    renames = profile.space.renames
    groups: dict[tuple[str, str], list[Point]] = defaultdict(list)
    for p in points:
        if p.kind == Kind.CANDIDATE and p.knob is not None and p.status != Status.VETOED:
            groups[(p.knob, _text(p.value))].append(p)
    rows = []
    for (knob, value), ps in sorted(groups.items()):
        with_effect = [p for p in ps if p.delta_pct is not None and p.objective]
        effects = tuple(p.delta_pct for p in with_effect if p.delta_pct is not None)
        last = next((p.interval for p in reversed(ps) if p.interval is not None), None)
        verdicts = Counter(str(p.status) for p in ps)
        rows.append(
            KnobRow(
                knob=knob,
                value=value,
                effects=effects,
                statuses=tuple(p.status for p in with_effect),
                crashes=sum(1 for p in ps if p.status == Status.CRASH),
                interval=last,
                boots=sum(p.boots for p in ps),
                failed_boots=sum(p.failed_boots for p in ps),
                measurements=sum(p.measurements for p in ps),
                verdicts=", ".join(f"{n} {s}" for s, n in sorted(verdicts.items())),
                prior=priors.get(renames.get(knob, knob)),
            )
        )
    return rows


def _boots(
    rnd: RoundRecord, experiments: list[ExperimentRecord], data: ReportData, seen: RoundBoots
) -> None:
    """Every boot of the round by use (``round_boots``), in hours, charged to the experiment it
    served (a champion's re-measurement to the experiment that was running when it was
    booted)."""
    end_of_round = rnd.finished_at or datetime.now(UTC)
    mine = {e.id: e for e in experiments}
    order = sorted(experiments, key=lambda e: e.created_at)
    for rb in seen.boots:
        boot, use = rb.boot, rb.use
        hours = ((boot.ended_at or end_of_round) - boot.started_at).total_seconds() / 3600
        owner = mine.get(boot.experiment_id)
        if owner is None or boot.role == BootRole.REMEASURE:
            running = [e for e in order if e.created_at <= boot.started_at]
            owner = running[-1] if running else (order[0] if order else None)
        data.boots_by_use[use] += 1
        if use == "clocks off: set aside":
            data.clocks_off_by_node.update(rb.slow)
        elif use == "failed: the infrastructure's":
            said = (boot.failure_detail or "").strip().splitlines()
            detail = clipped(said[0], 240) if said else ""
            data.infrastructure_failures[(str(boot.failure_class), detail)] += 1
        if owner is not None:
            spent = data.boot_hours.setdefault(owner.id, {})
            spent[use] = spent.get(use, 0.0) + hours


def _stops(ledger: Ledger, rnd: RoundRecord, resumed: list[Resume]) -> list[Stop]:
    """What stopped the round short (``stops.record_stop``), each with when it went on: the
    resume after it, else (a resume not recorded) its cluster's next boot."""
    out = []
    for event in ledger.events(rnd.cluster, EventKind.ROUND_STOPPED):
        if event.subject != str(rnd.id):
            continue
        went_on = [r.at for r in resumed if r.recorded and r.at >= event.created_at]
        after = [] if went_on else ledger.boots_since(rnd.cluster, event.created_at)
        out.append(
            Stop(
                at=event.created_at,
                exit_code=event.detail.get("exit_code"),
                line=event.reason,
                resumed_at=went_on[0] if went_on else after[0].started_at if after else None,
            )
        )
    return out


def _text(value: Value | None) -> str:
    return "(none)" if value is None else as_text(value)


def summary(data: ReportData) -> dict[str, float]:
    """The round in numbers, for its MLflow parent run: the champion's objective at the start
    and the end, the gain, experiments done and vetoed, keeps, boots (failed ones, and the
    infrastructure's: failed for a
    node's reasons or set aside for its clocks), the stops short, GPU-hours and LLM spend."""
    path = [c for c in data.champion_after if c is not None]
    out: dict[str, float] = {
        # as the budget counts them (``budget``); the proposals vetoed apart
        "experiments": float(data.done),
        "vetoed": float(data.vetoed),
        "vetoed_by_timeout": float(data.vetoed_by_timeout),
        "keeps": float(
            sum(1 for p in data.points if p.kind == Kind.CANDIDATE and p.status == Status.KEEP)
        ),
        # as ``status`` counts them (``round_boots``): boots paid, measurements weighed
        "boots": float(data.tally.boots),
        "measurements": float(data.tally.measurements),
        "failed_boots": float(data.tally.failed),
        "infrastructure_boots": float(sum(data.boots_by_use[u] for u in INFRASTRUCTURE_USES)),
        # kept, but their windows a busy host disturbed (``host_stalls``)
        "disturbed_boots": float(data.tally.disturbed),
        "stops": float(len(data.stops)),
        "resumes": float(len(data.resumes)),
        "gpu_hours": data.gpu_hours,
        "llm_spend_usd": data.llm_usd,
    }
    if path:
        out.update(start_objective=path[0], best_objective=path[-1])
        if path[0] > 0:
            out["gain_pct"] = (path[-1] / path[0] - 1.0) * 100.0
    return out


def launchers(profile: Profile, config: Config) -> dict[int, str]:
    """Every node's launcher for ``config`` (empty when it cannot be rendered here)."""
    runtime = runtime_placeholders()
    try:
        return {
            node.rank: render_node(
                profile.launcher, profile.space, config, profile.cluster, node, runtime
            ).script
            for node in profile.cluster.nodes
        }
    except (ProfileError, KnobError):
        return {}
