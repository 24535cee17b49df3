"""``orchestrate status`` as a person reads it: the champion, the unfinished round and the
proposals a person decides, then GPU-hours, what MLflow lacks, the nodes' troubles, open boots,
the lease and the priors (the numbers ``payload`` gives scripts, said)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

    from ledger import LeaseRecord
    from orchestrator.cli.status.seen import Seen
    from orchestrator.profile import Profile


def say_champion(console: Console, seen: Seen) -> None:
    """The cluster's counts, its champion, and what the profile changed of it."""
    from knobs.spec import as_text

    champion = seen.champion
    console.print(
        f"cluster {seen.name}: {len(seen.rounds)} round(s), {len(seen.experiments)} experiment(s)"
    )
    crashed = seen.unbootable
    if champion is None and crashed is not None:
        # the profile's to fix: the next round would boot the same config again
        console.print(
            "champion: none: the profile's champion did not boot as configured (experiment "
            f"#{crashed.id}, {crashed.failure_class}); fix champion: in profile {seen.profile}, "
            "then run `orchestrate round`",
            markup=False,
        )
    elif champion is None:
        console.print("champion: none yet (the next round measures the baseline first)")
    else:
        proposal = seen.proposal_of(champion.experiment_id)
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
    if seen.ignored is not None:
        console.print(seen.ignored, markup=False)
    for line in seen.changes:
        console.print(f"{line} (recorded by the next round or cluster up)")
    for line in seen.outside.values():
        console.print(line, markup=False)
    for line in seen.redefined.values():
        console.print(line, markup=False)
    if seen.restated is not None:
        console.print(seen.restated, markup=False)


def say_round(console: Console, seen: Seen, data: dict[str, Any], flag: str) -> None:
    """The unfinished round (running now, or to resume), the last round's boots (as its report
    counts them), and the proposals a person decides."""
    from orchestrator.approval import waits_for_a_person
    from orchestrator.measurements import BootCount
    from orchestrator.stops import said_stop
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
            boots = BootCount(u["boots"], u["failed"], u["measurements"]).words()
            of = "" if u["proposal"] is None else f"proposal {u['proposal']}: "
            console.print(
                f"  under way: experiment #{u['experiment']} ({of}{u['change']}), {boots}",
                markup=False,
            )
            if u["closed_on_resume"] is not None:
                console.print(f"    the resume closes it: {u['closed_on_resume']}", markup=False)
    elif seen.not_started is not None:
        console.print(
            f"no round began: the last `orchestrate round{flag}` {said_stop(seen.not_started)}",
            markup=False,
        )
    if (fell_back := seen.fallbacks.words()) is not None:
        console.print(f"round {seen.fallbacks.round_id}: {fell_back}", markup=False)
    if (tally := seen.tally) is not None:
        disturbed = tally.disturbed_words()
        console.print(
            f"round {tally.round}: {tally.words()}"
            + ("" if disturbed is None else f"; {disturbed}"),
            markup=False,
        )
    for p in seen.pending:
        console.print(waits_for_a_person(p, flag), markup=False)
    for p in seen.approved:
        console.print(
            f"proposal {p.id} of round {p.round_id} approved by {p.decided_by}: "
            f"{p.change.describe()}; the resume boots it first",
            markup=False,
        )


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
    if state == "gone":  # it never let go: killed (kill -9, a power cut), when last heard of
        return (
            f"{until} (not held: its process is gone, last heard from at "
            f"{lease.heartbeat_at:%Y-%m-%d %H:%M:%S} UTC: killed, or its machine went down)"
        )
    return f"{until} (not held: expired)"


def say_nodes(console: Console, prof: Profile, seen: Seen, data: dict[str, Any], flag: str) -> None:
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
    for round_id in seen.unclosed:
        console.print(
            f"MLflow's run of round {round_id} lacks its close (the round's numbers, report and "
            f"results.tsv: the command that closed it stopped as it wrote them): `orchestrate "
            f"report --round {round_id}` or the next `orchestrate round` writes them"
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
