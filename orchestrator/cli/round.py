"""``orchestrate round``: a baseline if there is no champion, then one-knob experiments; and
the terminal prompt of ``--approve ask``."""

from __future__ import annotations

import contextlib
import dataclasses
import shlex
import sys
import threading
from typing import TYPE_CHECKING, Annotated, Any, get_args

import typer
from rich.console import Console
from rich.text import Text

from orchestrator.cli.common import (
    JsonOpt,
    ProfileOpt,
    completes,
    in_ledger,
    one_of,
    opened,
    out,
)
from orchestrator.errors import OrchestrateError, UsageError
from orchestrator.profile_names import ApproveMode, ProposerKind

if TYPE_CHECKING:
    from agents import Proposer
    from ledger import ProposalRecord, RoundRecord
    from orchestrator.approval import Answer
    from orchestrator.display import RoundDisplay
    from orchestrator.profile import Profile
    from orchestrator.round import RoundOptions


def round_(
    budget: Annotated[
        int | None,
        typer.Option(
            "--budget", "-n", min=1, max=10_000, help="experiments to run (default: the profile's)"
        ),
    ] = None,
    profile: ProfileOpt = None,
    proposer: Annotated[
        str | None,
        typer.Option(
            help="optuna | sweep | claude | hybrid (default: the profile's)",
            callback=one_of("--proposer", lambda: get_args(ProposerKind)),
            autocompletion=completes(lambda: list(get_args(ProposerKind))),
        ),
    ] = None,
    approve: Annotated[
        str | None,
        typer.Option(
            help="auto | ask | queue (default: the profile's)",
            callback=one_of("--approve", lambda: get_args(ApproveMode)),
            autocompletion=completes(lambda: list(get_args(ApproveMode))),
        ),
    ] = None,
    max_hours: Annotated[
        float | None, typer.Option(min=0, help="stop starting experiments after this")
    ] = None,
    max_gpu_hours: Annotated[
        float | None,
        typer.Option(
            min=0,
            help="stop starting experiments once the round's boots have held this many "
            "GPU-hours (wall time x the GPUs the profile's nodes declare)",
        ),
    ] = None,
    seed: Annotated[
        int | None,
        typer.Option(
            min=0, callback=in_ledger, help="the proposer's seed (default: the profile's)"
        ),
    ] = None,
    new_mlflow_store: Annotated[
        bool,
        typer.Option(
            "--new-mlflow-store",
            help="log to the MLflow store MLFLOW_TRACKING_URI (else the profile's mlflow_uri) "
            "names although it lacks the runs this ledger logged before (a new store, or "
            "another): without it such a store is refused, as the wrong one; the rounds before "
            "stay where they were",
        ),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Run a round: baseline if there is no champion, then BUDGET one-knob experiments.

    An interrupted round (killed, Ctrl-C) is resumed by running the command again.
    """
    from cluster.errors import NodeError
    from ledger.mlflow_sink import MlflowSink, mlflow_experiment
    from orchestrator.approval import ApprovalGate, waits_for_a_person
    from orchestrator.away import record_away_at_start
    from orchestrator.cli.round_report import (
        print_report,
        report_stop,
        write_owed_closes,
        write_round_report,
    )
    from orchestrator.contacts import ledger_reached
    from orchestrator.crashpoints import deploy_progress
    from orchestrator.display import RoundDisplay
    from orchestrator.gpu_hours import cluster_gpus
    from orchestrator.lease import Ownership, still_leased
    from orchestrator.mlflow_store import logged_before, the_same_store
    from orchestrator.outages import through_ledger_outages, waiting_for_ledger, waiting_for_mlflow
    from orchestrator.profile import load_profile
    from orchestrator.round import RoundOptions, RoundRunner
    from orchestrator.settings import lease_ttl_s
    from orchestrator.testbed import round_testbed
    from orchestrator.unrecorded import found, kept_on_stop

    for flag, cap in (("--max-hours", max_hours), ("--max-gpu-hours", max_gpu_hours)):
        if cap == 0:  # kept with the round: every resume would stop before an experiment
            raise UsageError(f"{flag} 0 would stop the round before any experiment; give more")
    prof = load_profile(profile)
    if max_gpu_hours is not None and cluster_gpus(prof) == 0:
        raise UsageError(
            f"--max-gpu-hours {max_gpu_hours:g}: the nodes of profile {prof.name} declare no "
            "GPUs (gpus: 0), so it could never stop the round; give them gpus: N, or use "
            "--max-hours"
        )
    mode = approve or prof.approve.mode
    options = RoundOptions(
        budget=budget or prof.budget,
        proposer=proposer or prof.proposer.kind,
        approve=mode,
        max_hours=max_hours,
        max_gpu_hours=max_gpu_hours,
        seed=prof.proposer.seed if seed is None else seed,
    )
    # built here, so that a proposer the profile cannot make fails before anything is opened
    first: list[Proposer] = [_proposer(prof, options)]
    console = Console(stderr=True) if as_json else out()
    display = RoundDisplay(console)
    # --json: stdout is the report alone, whatever a library prints while the round runs
    # (MLflow's "View run … at …" with a tracking server): that goes to stderr
    quiet = contextlib.redirect_stdout(sys.stderr) if as_json else contextlib.nullcontext()
    # a stop the ledger cannot hold (its disk read-only or full, its server away) is kept
    # outside it, with the cells it could not write, for `status` and the next round
    with (
        opened(prof) as o,
        quiet,
        kept_on_stop(o.settings.ledger_url, prof.cluster.name) as stopping,
    ):
        # a ledger server that does not answer yet (restarting as a timer starts the night)
        # is waited for, as one that goes away mid-round is, if this machine reached it before
        # (else the URL is taken for wrong)
        reached = ledger_reached(o.settings.ledger_url)
        stopping.keeps = reached  # a server waited for, never a SQLite file (``ledger_reached``)
        ledger = waiting_for_ledger(
            o.ledger, url=o.settings.ledger_url, reached_before=reached, note=display.note
        )
        stopping.keeps = True
        stopping.opened(ledger)  # its last round names it in a stop kept, wherever it is
        # an unfinished round resumes as it started: its proposer, seed and approval unless
        # this command gives its own (``kept_on_resume`` says which); its budget and caps,
        # ``RoundRunner``
        resumed = ledger.unfinished_round(prof.cluster.name)
        # the stops the ledger could not hold, folded into it in order before the round resumes
        stopping.resuming(found(o.settings.ledger_url, prof.cluster.name))
        stopping.round_id = None if resumed is None else resumed.id
        if resumed is not None:
            kept = _as_started(
                options, resumed, budget=budget, proposer=proposer, seed=seed, approve=approve
            )
            if (kept.proposer, kept.seed) != (options.proposer, options.seed):
                first = [_proposer(prof, kept)]
        else:
            kept = options
        mode = kept.approve
        # ask only where a person can answer: under nohup, cron or a service stdin is no
        # terminal, and the gate refuses before the baseline boots (not at the first prompt,
        # hours later)
        at_terminal = mode == "ask" and sys.stdin.isatty()
        asker = _ask_at_terminal(console, display) if at_terminal else None
        gate = ApprovalGate(
            ledger,
            mode,
            asker=asker,
            queue_timeout_s=prof.approve.timeout_s,
            on_timeout=prof.approve.on_timeout,
            max_timeouts=prof.approve.max_timeouts,
            on_queued=lambda p: display.note(waits_for_a_person(p, _profile_flag(profile))),
        )
        # one MLflow experiment per cluster: its rounds side by side, no other cluster's; a
        # tracking server that does not answer yet (restarting as a timer starts the night)
        # is waited for, if it ever answered this ledger (else the URI is taken for wrong);
        # one that lacks the ledger's last run is another store, refused (``mlflow_store``)
        logged = logged_before(ledger, prof.cluster.name)
        sink = waiting_for_mlflow(
            lambda: the_same_store(
                lambda holds: MlflowSink(
                    o.settings.mlflow_uri,
                    experiment_name=mlflow_experiment(prof.cluster.name),
                    artifact_root=o.settings.artifact_root,
                    holds=holds,
                ),
                logged=logged,
                new_store=new_mlflow_store,
                configured=o.settings.mlflow_uri,
                experiment=mlflow_experiment(prof.cluster.name),
            ),
            reached_before=logged is not None,
            note=display.note,
        )
        # each node's start and /health are crash points of the kill suite (``crashpoints``);
        # right before a node's stop or launch goes out, the cluster still this process's
        deployer = o.deployer(
            progress=deploy_progress(display.phase), fence=lambda: still_leased(ledger)
        )
        # a cell stops where it stands the moment the lease or a node's claim is found
        # another's, and MLflow takes no write from a process that lost the cluster, as the
        # ledger takes none
        gone = threading.Event()
        testbed = round_testbed(prof, deployer, stop=gone)
        sink.fence(lambda: still_leased(ledger))
        # the ledger's lease and a claim on every node before the first deploy (issue #17)
        owner = Ownership(
            prof.cluster,
            what="round",
            ledger_url=ledger.url,
            ledger=o.ledger,
            note=display.note,
            ttl_s=lease_ttl_s(),
            gone=gone,
        )
        runners: list[RoundRunner] = []

        def runner() -> RoundRunner:
            runners.append(
                RoundRunner(
                    prof,
                    ledger,
                    sink,
                    testbed,
                    first.pop() if first else _proposer(prof, kept),
                    gate,
                    display,
                    guard=owner.check,
                    owes_close=True,  # ``write_round_report`` writes it, below
                )
            )
            return runners[-1]

        try:
            with owner:
                # what a round closed before this one left MLflow without (``round_close``)
                write_owed_closes(prof, ledger, sink, display)
                # a ledger that does not answer is waited out; each try builds the round
                # afresh (its proposer too) and resumes it from the ledger, as the same
                # command would
                # (the cells a try measured and could not write, written first)
                report = through_ledger_outages(
                    lambda: stopping.attempt(ledger, lambda: runner().run(kept), display.note),
                    note=display.note,
                )
        except (OrchestrateError, KeyboardInterrupt) as stop:
            # the claims and the lease released first: the nodes are free while it is written
            round_id = runners[-1].round_id if runners else None
            stopping.round_id = round_id or stopping.round_id
            if not runners and isinstance(stop, NodeError):
                # stopped as it claimed the nodes (a node away), before its round ran a step:
                # recorded as a stop mid-round is, for `status`, the report and the resume
                round_id = record_away_at_start(ledger, prof.cluster.name, resumed, stop)
            if round_id is not None:
                report_stop(prof, ledger, sink, round_id, stop, display)
            raise
        page = write_round_report(prof, ledger, sink, report.round, display)
    print_report(report, as_json, page)


def _profile_flag(profile: str | None) -> str:
    """`` --profile PATH`` for the commands a line suggests (empty: the default profile)."""
    return "" if profile is None else f" --profile {shlex.quote(profile)}"


def _as_started(
    options: RoundOptions,
    rnd: RoundRecord,
    *,
    budget: int | None,
    proposer: str | None,
    seed: int | None,
    approve: str | None,
) -> RoundOptions:
    """What unfinished round ``rnd``'s resume runs with: ``options``, its budget, proposer,
    seed and approval mode each the round's as it started unless this command gives its own
    (``budget``, ``proposer``, ``seed``, ``approve``: the flags, ``None`` where not given; a
    budget given is said and not taken, ``display.kept_on_resume``: a bare resume asked for
    none, whatever the profile's is now). A bare
    ``orchestrate round`` (a timer's, or the line ``status`` prints) resuming a round started
    with ``--approve queue`` must not run it unvetoed at the profile's default, nor one
    started with Claude under Optuna; a person who passes ``--approve auto`` to get a paused
    queue going means it."""
    return dataclasses.replace(
        options,
        budget=rnd.budget if budget is None else budget,
        proposer=rnd.proposer if proposer is None else proposer,
        seed=rnd.seed if seed is None else seed,
        approve=rnd.approve if approve is None else approve,
    )


def _proposer(prof: Profile, options: RoundOptions) -> Proposer:
    """The proposer ``--proposer`` names (else the profile's), with the profile's settings."""
    from agents import make_proposer
    from orchestrator.profile import default_brief

    kind = options.proposer
    proposer_options: dict[str, object] = (
        {"changes": prof.proposer.sweep} if prof.proposer.sweep else {}
    )
    if kind in ("claude", "hybrid"):
        claude = prof.proposer.claude
        proposer_options.update(claude.model_dump(exclude={"brief"}))
        proposer_options["brief"] = claude.brief or str(default_brief())
    return make_proposer(kind, seed=options.seed, options=proposer_options)


def _ask_at_terminal(console: Console, display: RoundDisplay) -> Any:
    def ask(p: ProposalRecord, problem: str | None) -> Answer:
        with display.paused():
            return _ask(console, p, problem)

    return ask


def _ask(console: Console, p: ProposalRecord, problem: str | None) -> Answer:
    from orchestrator.approval import Answer, proposal_rows

    # proposal texts may come from an LLM: shown as data, never as console markup
    if problem:
        console.print(Text(problem, style="red"))
    else:
        console.print(Text(f"\nProposal {p.id} ({p.source}): ", style="bold"), end="")
        console.print(Text(p.change.describe()))
        for label, value in proposal_rows(p):
            console.print(Text(f"  {label + ':':<11} {value}"))
    # after a refusal (a value the knob does not allow), the value may be typed again at once
    choices = "approve, edit or veto" + (f" (or a new value for {p.knob})" if problem else "")
    typed = typer.prompt(choices, default="approve").strip()
    action = {"a": "approve", "e": "edit", "v": "veto"}.get(typed.lower(), typed.lower())
    if action == "edit":
        return Answer("edit", value=typer.prompt(f"new value for {p.knob}"))
    if action == "veto":
        return Answer("veto", reason=typer.prompt("reason"))
    if action != "approve" and problem:
        return Answer("edit", value=typed)
    return Answer(action)
