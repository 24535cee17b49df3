"""``orchestrate status --json``: what ``Seen`` says, for scripts."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from orchestrator.cli.status.seen import Seen
    from orchestrator.profile import Profile


def as_data(prof: Profile, seen: Seen, flag: str) -> dict[str, Any]:
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
            "proposal": seen.proposal_of(champion.experiment_id),
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
        # the profile's champion: edited once the ledger had a champion: not used, and why
        "profile_champion_not_used": seen.ignored,
        # no champion: the baseline whose champion as configured did not boot (the profile's)
        "champion_did_not_boot": None
        if seen.unbootable is None
        else {
            "experiment": seen.unbootable.id,
            "failure_class": seen.unbootable.failure_class,
        },
        "rounds": len(seen.rounds),
        "experiments": len(seen.experiments),
        "running_round": _running(seen),
        "not_started": stop_data(seen.not_started),  # before any round began: a node away
        # the last round's: how many of its LLM proposals fell back, and why
        "llm_fallbacks": seen.fallbacks.as_json(),
        # the last round's boots paid, measurements weighed and boots a busy host disturbed,
        # as its report counts them (``round_boots``)
        "last_round": None if seen.tally is None else seen.tally.as_json(),
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
        # approved while the round was stopped, not yet taken up: the resume boots them first
        "approved_proposals": [
            {"proposal": p.id, "round": p.round_id, "change": p.change.describe()}
            for p in seen.approved
        ],
        "gpu_hours": round(sum(seen.used.values()), 4),
        # the cells the profile redefined since their last reading (``changed_cells``)
        "changed_cells": list(seen.redefined),
        # the champion's launchers render differently now: why it is measured again
        "champion_to_measure_again": seen.restated,
        "held_for_mlflow": seen.held,
        # rounds done whose numbers, report and results.tsv their MLflow run lacks
        "rounds_to_close_in_mlflow": seen.unclosed,
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


def _running(seen: Seen) -> dict[str, Any] | None:
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


def _nodes(prof: Profile, seen: Seen) -> list[dict[str, Any]]:
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
