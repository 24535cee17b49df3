"""``orchestrate status``: the champion, the unfinished round (and why it stopped short, if it
did), what MLflow still lacks, a node whose clocks are off more often than chance explains,
the boots each node failed for the infrastructure's reasons, and the lease."""

from __future__ import annotations

import json
import shlex
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import typer

from orchestrator.cli.common import JsonOpt, ProfileOpt, opened, out

if TYPE_CHECKING:
    from rich.console import Console

    from agents.llm_fallback import Fallbacks
    from ledger import (
        BootRecord,
        ChampionRecord,
        EventRecord,
        ExperimentRecord,
        LeaseRecord,
        Ledger,
        ProposalRecord,
        RoundRecord,
    )
    from orchestrator.champion_level import CellsChanged, LevelInForce
    from orchestrator.priors import Measured
    from orchestrator.profile import Profile
    from orchestrator.step_cost import StepCost


def status(profile: ProfileOpt = None, as_json: JsonOpt = False) -> None:
    """The champion, the running round, budget spent and who holds the cluster's lease."""
    from orchestrator.profile import load_profile

    prof = load_profile(profile)
    with opened(prof) as o:
        seen = _read(prof, o.ledger(create=False))
    # the commands this status suggests, under the profile it read (the round's)
    flag = "" if profile is None else f" --profile {shlex.quote(profile)}"
    data = _as_data(prof, seen, flag)
    if as_json:
        typer.echo(json.dumps(data, indent=2))
        return
    console = out()
    _say_champion(console, seen)
    _say_round(console, seen, data, flag)
    _say_nodes(console, prof, seen, data, flag)


@dataclass
class _Seen:
    """What ``status`` read of the ledger, in one session."""

    name: str
    champion: ChampionRecord | None
    #: what fitting the champion to the profile changed that nothing recorded yet
    changes: list[str]
    #: the champion's values the profile's domain no longer has
    outside: dict[str, str]
    #: the cells redefined since their last reading
    redefined: dict[str, str]
    #: why the champion is measured again: its launchers render differently now (or None)
    restated: str | None
    #: the champion's level in force where it is not what its row records (measured again)
    level: LevelInForce | None
    #: the cells the profile removed or added since the champion was measured
    cells: CellsChanged | None
    running: RoundRecord | None
    lease: LeaseRecord | None
    #: a live holder (a round running now): a resume or `cluster down` would be refused
    live: bool
    #: the lease's state, read once (``lease.state``: held, suspended, gone, expired)
    lease_state: str | None
    #: boots no teardown closed
    left_open: list[BootRecord]
    rounds: list[RoundRecord]
    experiments: list[ExperimentRecord]
    effects: list[Measured]
    set_aside: dict[int, dict[str, Any]]
    draft: str | None
    step: StepCost | None
    used: dict[int, float]
    held: list[int]
    pending: list[ProposalRecord]
    stopped: EventRecord | None
    not_started: EventRecord | None  # a round command stopped before any round (a node away)
    counted: int
    off: dict[int, int]
    failed: dict[int | None, Counter[str]]
    undecided: list[dict[str, Any]]
    fallbacks: Fallbacks  # the last round's LLM proposals and its fallbacks (``llm_fallback``)


def _read(prof: Profile, ledger: Ledger) -> _Seen:
    """Everything ``status`` says, read from ``ledger``."""
    from agents.draft_model import draft_knob
    from agents.llm_fallback import Fallbacks
    from knobs.vocabulary import ProposalStatus, State
    from orchestrator.away import before_a_round
    from orchestrator.champion import ChampionEvidence
    from orchestrator.champion_level import level_in_force, shown
    from orchestrator.evolution import knob_changes, outside_domain
    from orchestrator.faults import failed_by_node, last_stop
    from orchestrator.gpu_hours import gpu_hours
    from orchestrator.lease import state as lease_state
    from orchestrator.measurements import changed_cells, clocks_off_counts
    from orchestrator.priors import measured
    from orchestrator.step_cost import learned
    from orchestrator.undecided import under_way

    name = prof.cluster.name
    # the profile gained or lost a knob since: the champion as this profile sees it, and
    # what fitting it changed that no round or ``cluster up`` has recorded yet; its objective
    # over the profile's cells of now, and the cells it removed or added since
    changes = knob_changes(prof.space, ledger, name, record=False)
    evidence = ChampionEvidence(prof, ledger)
    champion, cells = shown(evidence)
    running = ledger.unfinished_round(name)
    lease = ledger.lease(name)
    state = None if lease is None else lease_state(lease)
    rounds = ledger.rounds(name)
    experiments = ledger.experiments(cluster=name)
    mine = {r.id for r in rounds}
    counted, off = clocks_off_counts(ledger, name, prof.cells, prof.gates.min_matmul_rate)
    return _Seen(
        name=name,
        champion=champion,
        changes=changes,
        # a value the profile's domain no longer has: the champion keeps it, and it is said
        outside={} if champion is None else outside_domain(prof.space, champion.config),
        # a cell redefined since it was measured: the next round measures it again
        redefined=changed_cells(ledger, name, prof.cells),
        # a knob's flag dropped or gained since it was measured: the next round measures it
        restated=evidence.restated(evidence.revised()),
        level=level_in_force(evidence),
        cells=cells,
        running=running,
        lease=lease,
        live=state == "held",
        lease_state=state,
        # a run killed (kill -9, a power cut) left them, and their engines may still hold the
        # nodes' GPUs, unless a round holds the cluster right now
        left_open=ledger.open_boots(name),
        rounds=rounds,
        experiments=experiments,
        effects=measured(ledger, experiments),  # each knob's measured changes, for its prior
        set_aside=evidence.set_aside(),  # its keep's boots, if they left
        draft=None if (spec := draft_knob(prof.space)) is None else spec.name,
        # the step cost a K change's verdict subtracts from its counters (``step_cost``)
        step=learned(ledger, prof.space, experiments),
        used={r.id: gpu_hours(ledger, r, prof) for r in rounds},
        held=ledger.holding(name),  # experiments whose boots' texts MLflow still lacks
        # proposals of this cluster's rounds a person has not decided (``--approve queue``)
        pending=[p for p in ledger.proposals(status=ProposalStatus.PENDING) if p.round_id in mine],
        stopped=None if running is None else last_stop(ledger, name, running.id),
        not_started=before_a_round(ledger, name) if running is None else None,
        # each node's clocks over the cluster's measurements (``policy.flaky_nodes``)
        counted=counted,
        off=off,
        failed=failed_by_node(ledger, name),
        # what the unfinished round has under way: the change a resume takes up first
        undecided=[
            under_way(e, ledger.boots(e.id))
            for e in experiments
            if running is not None and e.round_id == running.id and e.state != State.DECIDED
        ],
        fallbacks=Fallbacks.of(
            ((p.source, p.notes) for p in ledger.proposals(round_id=rounds[-1].id)),
            round_id=rounds[-1].id,
        )
        if rounds
        else Fallbacks(),
    )


def _as_data(prof: Profile, seen: _Seen, flag: str) -> dict[str, Any]:
    """``status --json``: what ``seen`` says, for scripts."""
    from orchestrator.away import stop_data
    from orchestrator.priors import knob_priors

    champion, lease, step = seen.champion, seen.lease, seen.step
    data: dict[str, Any] = {
        "cluster": seen.name,
        "champion": None
        if champion is None
        else {
            "experiment": champion.experiment_id,
            "proposal": _proposal_of(seen, champion.experiment_id),
            "objective": champion.objective,
            "config": champion.config.as_dict(),
            # the boots that kept it, if they left its level (``remeasure``)
            "keep_boots_set_aside": seen.set_aside.get(champion.experiment_id),
            # the knobs whose value the profile's domain no longer has (``outside_domain``)
            "outside_domain": list(seen.outside),
            # measured again since its verdict: what its row in results.tsv keeps
            "measured_again": None if seen.level is None else seen.level.as_json(),
            # the cells the profile removed or added since it was measured (``champion_level``)
            "cells_changed": None if seen.cells is None else seen.cells.as_json(),
        },
        "rounds": len(seen.rounds),
        "experiments": len(seen.experiments),
        "running_round": _running(seen),
        "not_started": stop_data(seen.not_started),  # before any round began: a node away
        # the last round's: how many of its LLM proposals fell back, and why
        "llm_fallbacks": seen.fallbacks.as_json(),
        "pending_proposals": [
            {
                "proposal": p.id,
                "round": p.round_id,
                "change": p.change.describe(),
                "source": p.source,
                "hypothesis": p.hypothesis,
                "proposed_at": p.created_at.isoformat(),
                "approve": f"orchestrate proposals approve {p.id}{flag}",
                "veto": f"orchestrate proposals veto {p.id} --reason TEXT{flag}",
            }
            for p in seen.pending
        ],
        "gpu_hours": round(sum(seen.used.values()), 4),
        # the cells the profile redefined since their last reading (``changed_cells``)
        "changed_cells": list(seen.redefined),
        # the champion's launchers render differently now: why it is measured again
        "champion_measured_again": seen.restated,
        "held_for_mlflow": seen.held,
        "open_boots": len(seen.left_open),
        "lease": None
        if lease is None
        else {
            "holder": lease.holder,
            "expires_at": lease.expires_at.isoformat(),
            # expired, or its holder a process of this host that is gone (a killed round)
            "held": seen.live,
            # held, suspended (expired, its process alive here: not renewing it), gone (its
            # process of this host gone), expired (another host's)
            "state": seen.lease_state,
        },
        "nodes": _nodes(prof, seen),
        # such failures the ledger names no node for (recorded before schema 6, or none named)
        "infrastructure_failures_without_node": sum(seen.failed.get(None, {}).values()),
    }
    data["knob_priors"] = {
        knob: {
            "p_null": prior.p_null,
            "effect_pct": prior.effect_pct,
            "n": sum(1 for m in seen.effects if m.knob == knob),
            "source": prior.source,
        }
        for knob, prior in knob_priors(prof, seen.effects).items()
    }
    data["step_cost"] = (
        None
        if step is None
        else {
            "knob": seen.draft,
            "gamma": step.gamma,
            "gamma_sd": step.gamma_sd,
            "error": step.error,
            "n": step.changes,
        }
    )
    return data


def _running(seen: _Seen) -> dict[str, Any] | None:
    """The unfinished round, for ``status --json``."""
    from orchestrator import budget
    from orchestrator.away import stop_data

    running, stopped, lease = seen.running, seen.stopped, seen.lease
    if running is None:
        return None
    return {
        "round": running.id,
        "budget": running.budget,
        "done": budget.done(e for e in seen.experiments if e.round_id == running.id),
        "gpu_hours": round(seen.used[running.id], 4),
        "max_gpu_hours": running.max_gpu_hours,
        # why it stopped short, when nothing has booted for it since (``round-stopped``)
        "stopped": stop_data(stopped),
        "undecided": seen.undecided,
        # whether it runs now: the lease held live (its holder, since when)
        "live": seen.live,
        "held_by": None if lease is None or not seen.live else lease.holder,
        "since": None if lease is None or not seen.live else lease.acquired_at.isoformat(),
    }


def _nodes(prof: Profile, seen: _Seen) -> list[dict[str, Any]]:
    """Each node's clocks and the boots that failed on it for its own reasons."""
    from orchestrator.policy import ClocksHistory, clocks_off_rate, flaky_nodes

    history = ClocksHistory(seen.counted, seen.off, [n.rank for n in prof.cluster.nodes])
    flaky = flaky_nodes(history)
    return [
        {
            "rank": n.rank,
            "name": n.name,
            "host": n.host,
            "measurements": seen.counted,
            "clocks_off": seen.off.get(n.rank, 0),
            "clocks_off_rate": round(clocks_off_rate(history, n.rank), 4),
            "flaky": n.rank in flaky,
            # the boots that failed on it for the infrastructure's reasons, by class
            "infrastructure_failures": dict(seen.failed.get(n.rank, {})),
        }
        for n in prof.cluster.nodes
    ]


def _say_champion(console: Console, seen: _Seen) -> None:
    """The cluster's counts, its champion, and what the profile changed of it."""
    from knobs.spec import as_text

    champion = seen.champion
    console.print(
        f"cluster {seen.name}: {len(seen.rounds)} round(s), {len(seen.experiments)} experiment(s)"
    )
    if champion is None:
        console.print("champion: none yet (the next round measures the baseline first)")
    else:
        proposal = _proposal_of(seen, champion.experiment_id)
        console.print(
            f"champion: experiment #{champion.experiment_id}"
            + ("" if proposal is None else f" (proposal {proposal})")
            + f", objective {champion.objective:.1f}: "
            + ", ".join(f"{k}={as_text(v)}" for k, v in champion.config.items())
        )
        for said in (seen.level, seen.cells):
            if said is not None:
                console.print(f"  {said.words()}", markup=False)
        aside = seen.set_aside.get(champion.experiment_id)
        if aside is not None:
            console.print(
                f"  its level is its own boots from measurement {aside.get('measurement')} on: "
                f"the {aside.get('keep_boots')} boot(s) that kept it read high and were set aside",
                markup=False,
            )
    for line in seen.changes:
        console.print(f"{line} (recorded by the next round or cluster up)")
    for line in seen.outside.values():
        console.print(line, markup=False)
    for line in seen.redefined.values():
        console.print(line, markup=False)
    if seen.restated is not None:
        console.print(seen.restated, markup=False)


def _proposal_of(seen: _Seen, experiment: int) -> int | None:
    """The proposal experiment ``experiment`` came from (``None``: a baseline's, or none)."""
    return next((e.proposal_id for e in seen.experiments if e.id == experiment), None)


def _say_round(console: Console, seen: _Seen, data: dict[str, Any], flag: str) -> None:
    """The unfinished round (running now, or to resume), and the proposals a person decides."""
    from orchestrator.approval import waits_for_a_person
    from orchestrator.faults import said_stop
    from orchestrator.measurements import BootCount
    from orchestrator.timestamps import utc_minute

    running, lease = seen.running, seen.lease
    if running is not None:
        r = data["running_round"]
        cap = "" if running.max_gpu_hours is None else f" of {running.max_gpu_hours:g}"
        spent = f"{r['done']} of {r['budget']} done, {r['gpu_hours']:.2f}{cap} GPU-hours"
        if seen.live and lease is not None:
            console.print(
                f"round {running.id} running: {spent} (held by {lease.holder} since "
                f"{utc_minute(lease.acquired_at)})",
                markup=False,
            )
        elif seen.lease_state == "suspended" and lease is not None:
            console.print(f"round {running.id} {_suspended(lease, flag)}: {spent}", markup=False)
        else:
            console.print(
                f"round {running.id} unfinished: {spent} (run `orchestrate round{flag}` to resume)",
                markup=False,
            )
        if seen.stopped is not None:
            console.print(f"  it {said_stop(seen.stopped)}", markup=False)
        for u in seen.undecided:
            boots = BootCount(u["boots"], u["failed"]).words()
            of = "" if u["proposal"] is None else f"proposal {u['proposal']}: "
            console.print(
                f"  under way: experiment #{u['experiment']} ({of}{u['change']}), {boots}",
                markup=False,
            )
    elif seen.not_started is not None:
        console.print(
            f"no round began: the last `orchestrate round{flag}` {said_stop(seen.not_started)}",
            markup=False,
        )
    if (fell_back := seen.fallbacks.words()) is not None:
        console.print(f"round {seen.fallbacks.round_id}: {fell_back}", markup=False)
    for p in seen.pending:
        console.print(waits_for_a_person(p, flag), markup=False)


def _suspended(lease: LeaseRecord, flag: str) -> str:
    """A round whose lease expired while its process, on this host, still exists."""
    return (
        f"running, but its lease expired at {lease.expires_at:%H:%M:%S} UTC — its process "
        f"(pid {lease.pid}) is alive and not renewing it (suspended?): `kill -CONT "
        f"{lease.pid}` wakes it, or `orchestrate round{flag}` takes the round over (the "
        "suspended one then stops on waking, exit 8)"
    )


def _lease_words(lease: LeaseRecord, state: str | None) -> str:
    """The lease's line, as its state (``lease.state``) says it."""
    until = f"{lease.holder} until {lease.expires_at:%H:%M:%S} UTC"
    if state == "held":
        return until
    if state == "suspended":
        return (
            f"{lease.holder} expired at {lease.expires_at:%H:%M:%S} UTC (not held: its process "
            "is alive and not renewing it, suspended?)"
        )
    why = "its process is gone" if state == "gone" else "expired"
    return f"{until} (not held: {why})"


def _say_nodes(
    console: Console, prof: Profile, seen: _Seen, data: dict[str, Any], flag: str
) -> None:
    """GPU-hours, what MLflow lacks, the nodes' troubles, open boots, the lease, the priors."""
    from orchestrator.gpu_hours import cluster_gpus
    from orchestrator.step_cost import describe

    console.print(
        f"GPU-hours: {data['gpu_hours']:.2f} over {len(seen.rounds)} round(s) "
        f"({cluster_gpus(prof)} GPU(s) per boot)"
    )
    if seen.held:
        console.print(
            f"MLflow lacks the launchers and engine logs of {len(seen.held)} experiment(s) "
            f"({', '.join(f'#{i}' for i in seen.held)}), booted while it was away: the ledger "
            "holds them, and the next `orchestrate round` puts them on their runs"
        )
    others = "the cluster's other nodes'" if len(data["nodes"]) > 1 else "a node's usual"
    for node in data["nodes"]:
        if node["flaky"]:
            console.print(
                f"{node['name']} ({node['host']}): clocks off in {node['clocks_off']} of "
                f"{seen.counted} measurements, more often than {others} rate explains; each "
                "such boot was set aside and booted again (power-cycle or service the node)",
                markup=False,
            )
        if node["infrastructure_failures"]:
            classes = node["infrastructure_failures"]
            console.print(
                f"{node['name']} ({node['host']}): {sum(classes.values())} boot(s) failed for "
                f"the node's reasons, not a config's: {_counted(classes)}",
                markup=False,
            )
    if seen.left_open and seen.live:
        console.print(
            f"{len(seen.left_open)} boot(s) open: the engines of the command that holds the "
            "lease now (`orchestrate cluster status` shows which nodes run)",
            markup=False,
        )
    elif seen.left_open and seen.lease_state == "suspended":
        console.print(
            f"{len(seen.left_open)} boot(s) open: the engines of the suspended round above, "
            "whose process is alive (`orchestrate cluster status` shows which nodes run); "
            "wake it, or take the round over, before stopping them",
            markup=False,
        )
    elif seen.left_open:
        console.print(
            f"{len(seen.left_open)} boot(s) open: engines left by a run that was killed, which "
            "may still hold the nodes' GPUs (`orchestrate cluster status` shows which nodes "
            f"run); `orchestrate round{flag}` stops those a killed run left, or `orchestrate "
            "cluster down` now",
            markup=False,
        )
    lease = seen.lease
    if lease is not None:
        console.print(f"lease: {_lease_words(lease, seen.lease_state)}", markup=False)
    console.print("effect priors in force (the verdict's and the proposer's):")
    for knob, p in data["knob_priors"].items():
        console.print(
            f"  {knob}: {p['p_null']:.0%} null, ±{p['effect_pct']:.1f}%, "
            f"n={p['n']}: {p['source'] or 'the profile prior'}",
            markup=False,
        )
    if seen.step is not None:
        console.print(
            f"step cost of {seen.draft} (its verdicts' null): {describe(seen.step)}", markup=False
        )


def _counted(classes: dict[str, int]) -> str:
    """``disk_full ×1, unreachable ×2``: failure classes and their counts, by name."""
    return ", ".join(f"{cls} ×{n}" for cls, n in sorted(classes.items()))
