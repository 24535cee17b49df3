"""The ``orchestrate`` command line. The only place that turns an error into an exit code."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.text import Text

from agents import make_proposer
from cluster.bench import run_cell
from cluster.twin import cli as twin_cli
from knobs.errors import UsageError
from knobs.spec import as_text
from ledger import ExperimentRecord, Ledger, ProposalRecord, tsv_text
from ledger.mlflow_sink import MlflowSink
from orchestrator.approval import Answer, ApprovalGate, llm_summary
from orchestrator.display import RoundDisplay, experiments_table
from orchestrator.engines_cli import engines_app
from orchestrator.exits import run_app
from orchestrator.lease import ClusterLease
from orchestrator.profile import default_brief, load_profile
from orchestrator.round import RoundOptions, RoundRunner
from orchestrator.settings import Settings
from orchestrator.testbed import ClusterTestbed, deployer_for

app = typer.Typer(
    name="orchestrate",
    help="Autoresearch for LLM-serving clusters: propose one knob change, deploy it, bench it, "
    "judge it against the champion, record everything.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
proposals_app = typer.Typer(
    help="Proposals waiting for a person (--approve queue).", no_args_is_help=True
)
cluster_app = typer.Typer(help="Drive the profile's cluster by hand.", no_args_is_help=True)
twin_app = typer.Typer(help="The digital twin engine.", no_args_is_help=True)
app.add_typer(proposals_app, name="proposals")
app.add_typer(cluster_app, name="cluster")
app.add_typer(twin_app, name="twin")
app.add_typer(engines_app, name="engines")

ProfileOpt = Annotated[
    str | None,
    typer.Option("--profile", "-p", help="profile YAML path or embedded name (default: twin)"),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="print JSON for scripts")]


def _out() -> Console:
    return Console(highlight=False, soft_wrap=True)


def _experiment_json(e: ExperimentRecord) -> dict[str, Any]:
    return {
        "experiment": e.id,
        "round": e.round_id,
        "kind": e.kind,
        "knob": e.knob,
        "value": e.value,
        "description": e.description,
        "config": e.config.as_dict(),
        "config_key": e.config.key,
        "state": e.state,
        "status": e.status,
        "objective": e.objective,
        "delta_pct": e.delta_pct,
        "accept_len": e.accept_len,
        "failure_class": e.failure_class,
        "mlflow_run_id": e.mlflow_run_id,
    }


def _ask_at_terminal(console: Console, display: RoundDisplay) -> Any:
    def ask(p: ProposalRecord, problem: str | None) -> Answer:
        with display.paused():
            return _ask(console, p, problem)

    return ask


def _ask(console: Console, p: ProposalRecord, problem: str | None) -> Answer:
    # proposal texts may come from an LLM: shown as data, never as console markup
    if problem:
        console.print(Text(problem, style="red"))
    else:
        console.print(Text(f"\nProposal {p.id} ({p.source}): ", style="bold"), end="")
        console.print(Text(f"{p.knob} {as_text(p.old_value)} → {as_text(p.new_value)}"))
        rows = [
            ("hypothesis", p.hypothesis),
            ("expected", p.expected_effect),
            ("risk", p.risk),
            ("cost", p.estimated_cost),
            ("llm", llm_summary(p.notes)),
        ]
        for label, value in rows:
            if value or label != "llm":
                console.print(Text(f"  {label + ':':<11} {value or '-'}"))
    action = typer.prompt("approve, edit or veto", default="approve").strip().lower()
    action = {"a": "approve", "e": "edit", "v": "veto"}.get(action, action)
    if action == "edit":
        return Answer("edit", value=typer.prompt(f"new value for {p.knob}"))
    if action == "veto":
        return Answer("veto", reason=typer.prompt("reason"))
    return Answer(action)


@app.command("round")
def round_(
    budget: Annotated[
        int | None,
        typer.Option("--budget", "-n", min=1, help="experiments to run (default: the profile's)"),
    ] = None,
    profile: ProfileOpt = None,
    proposer: Annotated[
        str | None, typer.Option(help="optuna | sweep | claude | hybrid (default: the profile's)")
    ] = None,
    approve: Annotated[
        str | None, typer.Option(help="auto | ask | queue (default: the profile's)")
    ] = None,
    max_hours: Annotated[
        float | None, typer.Option(min=0, help="stop starting experiments after this")
    ] = None,
    seed: Annotated[
        int | None, typer.Option(help="the proposer's seed (default: the profile's)")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Run a round: baseline if there is no champion, then BUDGET one-knob experiments.

    An interrupted round (killed, Ctrl-C) is resumed by running the command again.
    """
    prof = load_profile(profile)
    settings = Settings.resolve(prof)
    kind = proposer or prof.proposer.kind
    mode = approve or prof.approve.mode
    options = RoundOptions(
        budget=budget or prof.budget,
        proposer=kind,
        approve=mode,
        max_hours=max_hours,
        seed=prof.proposer.seed if seed is None else seed,
    )
    proposer_options: dict[str, object] = (
        {"changes": prof.proposer.sweep} if prof.proposer.sweep else {}
    )
    if kind in ("claude", "hybrid"):
        claude = prof.proposer.claude
        proposer_options.update(claude.model_dump(exclude={"brief"}))
        proposer_options["brief"] = claude.brief or str(default_brief())
    proposer_obj = make_proposer(kind, seed=options.seed, options=proposer_options)
    console = Console(stderr=True) if as_json else _out()
    display = RoundDisplay(console)
    # --json keeps stdout for the report: ask only where a person can answer
    at_terminal = mode == "ask" and (sys.stdin.isatty() or not as_json)
    asker = _ask_at_terminal(console, display) if at_terminal else None
    ledger = Ledger(settings.ledger_url)
    gate = ApprovalGate(
        ledger,
        mode,
        asker=asker,
        queue_timeout_s=prof.approve.timeout_s,
        on_timeout=prof.approve.on_timeout,
        max_timeouts=prof.approve.max_timeouts,
    )
    sink = MlflowSink(settings.mlflow_uri, artifact_root=settings.artifact_root)
    testbed = ClusterTestbed(
        deployer_for(prof, progress=display.phase), prof.cluster.base_url, prof.model
    )
    with ClusterLease(ledger, prof.cluster.name):
        report = RoundRunner(prof, ledger, sink, testbed, proposer_obj, gate, display).run(options)
    if as_json:
        payload = {
            "round": report.round.id,
            "status": report.round.status,
            "resumed": report.resumed,
            "stopped_by": report.stopped_by,
            "experiments": [_experiment_json(e) for e in report.experiments],
            "champion": None
            if report.champion is None
            else {
                "experiment": report.champion.experiment_id,
                "objective": report.champion.objective,
                "config": report.champion.config.as_dict(),
            },
        }
        typer.echo(json.dumps(payload, indent=2))
        return
    out = _out()
    out.print(experiments_table(report.experiments, report.champion, f"Round {report.round.id}"))
    if report.champion is not None:
        settings_text = ", ".join(f"{k}={as_text(v)}" for k, v in report.champion.config.items())
        out.print(
            f"champion: experiment #{report.champion.experiment_id}, objective "
            f"{report.champion.objective:.1f}  ({settings_text})"
        )


@app.command()
def status(profile: ProfileOpt = None, as_json: JsonOpt = False) -> None:
    """The champion, the running round, budget spent and who holds the cluster's lease."""
    prof = load_profile(profile)
    ledger = Ledger(Settings.resolve(prof).ledger_url)
    name = prof.cluster.name
    champion = ledger.champion(name)
    running = ledger.unfinished_round(name)
    lease = ledger.lease(name)
    rounds = ledger.rounds(name)
    experiments = ledger.experiments(cluster=name)
    data: dict[str, Any] = {
        "cluster": name,
        "champion": None
        if champion is None
        else {
            "experiment": champion.experiment_id,
            "objective": champion.objective,
            "config": champion.config.as_dict(),
        },
        "rounds": len(rounds),
        "experiments": len(experiments),
        "running_round": None
        if running is None
        else {
            "round": running.id,
            "budget": running.budget,
            "done": sum(
                1
                for e in experiments
                if e.round_id == running.id
                and e.kind == "candidate"
                and e.state == "decided"
                and e.status != "vetoed"
            ),
        },
        "lease": None
        if lease is None
        else {"holder": lease.holder, "expires_at": lease.expires_at.isoformat()},
    }
    if as_json:
        typer.echo(json.dumps(data, indent=2))
        return
    out = _out()
    out.print(f"cluster {name}: {len(rounds)} round(s), {len(experiments)} experiment(s)")
    if champion is None:
        out.print("champion: none yet (the next round measures the baseline first)")
    else:
        out.print(
            f"champion: experiment #{champion.experiment_id}, objective {champion.objective:.1f}: "
            + ", ".join(f"{k}={as_text(v)}" for k, v in champion.config.items())
        )
    if running is not None:
        r = data["running_round"]
        out.print(
            f"round {running.id} unfinished: {r['done']} of {r['budget']} done "
            "(run `orchestrate round` to resume)"
        )
    if lease is not None:
        out.print(f"lease: {lease.holder} until {lease.expires_at:%H:%M:%S} UTC")


@app.command()
def export(
    path: Annotated[str, typer.Argument(help="file to write, or - for stdout")] = "results.tsv",
    profile: ProfileOpt = None,
) -> None:
    """Write results.tsv: one row per decided experiment, oldest first."""
    prof = load_profile(profile)
    ledger = Ledger(Settings.resolve(prof).ledger_url)
    text = tsv_text(ledger.experiments(cluster=prof.cluster.name))
    if path == "-":
        sys.stdout.write(text)
        return
    try:
        Path(path).write_text(text)
    except OSError as e:
        raise UsageError(f"cannot write {path}: {e.strerror}") from e
    typer.echo(f"wrote {path} ({text.count(chr(10)) - 1} experiments)", err=True)


@proposals_app.command("list")
def proposals_list(
    profile: ProfileOpt = None,
    all_: Annotated[bool, typer.Option("--all", help="decided ones too")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Proposals waiting for a decision (or all of them)."""
    prof = load_profile(profile)
    ledger = Ledger(Settings.resolve(prof).ledger_url)
    rows = ledger.proposals(status=None if all_ else "pending")
    if as_json:
        typer.echo(json.dumps([p.model_dump(mode="json") for p in rows], indent=2))
        return
    if not rows:
        typer.echo("no pending proposals")
    for p in rows:
        typer.echo(
            f"{p.id}\t{p.status}\t{p.knob} {as_text(p.old_value)} -> {as_text(p.new_value)}"
            f"\t{p.source}\t{p.hypothesis}"
        )


@proposals_app.command("approve")
def proposals_approve(
    proposal_id: Annotated[int, typer.Argument(help="the proposal's ID")],
    profile: ProfileOpt = None,
) -> None:
    """Approve a pending proposal; the waiting round deploys it."""
    prof = load_profile(profile)
    ledger = Ledger(Settings.resolve(prof).ledger_url)
    p = ledger.decide_proposal(proposal_id, status="approved", by="person")
    typer.echo(f"approved proposal {p.id}: {p.knob} -> {as_text(p.new_value)}")


@proposals_app.command("veto")
def proposals_veto(
    proposal_id: Annotated[int, typer.Argument(help="the proposal's ID")],
    reason: Annotated[str, typer.Option("--reason", help="why (shown to every proposer)")],
    profile: ProfileOpt = None,
) -> None:
    """Veto a pending proposal; it is recorded and never proposed again."""
    prof = load_profile(profile)
    ledger = Ledger(Settings.resolve(prof).ledger_url)
    p = ledger.decide_proposal(proposal_id, status="vetoed", by="person", reason=reason)
    typer.echo(f"vetoed proposal {p.id}: {p.knob} -> {as_text(p.new_value)}")


@cluster_app.command("check")
def cluster_check(profile: ProfileOpt = None) -> None:
    """Preflight every node: reachable (SSH: host key, auth), its address on the cluster
    interface, free memory settled, clocks healthy. Changes nothing."""
    prof = load_profile(profile)
    deployer = deployer_for(prof)
    try:
        reached = deployer.reach()
        for rank, err in sorted(reached.items()):
            typer.echo(f"node-{rank}: " + ("reachable" if err is None else f"{err.message}"))
        failed = [e for _, e in sorted(reached.items()) if e is not None]
        if failed:
            raise failed[0]
        for clock in deployer.preflight():
            typer.echo(
                f"node-{clock.rank}: sm clock {clock.sm_clock_mhz:.0f} MHz, "
                f"matmul rate {clock.matmul_rate:.2f}"
            )
    finally:
        deployer.close()
    typer.echo(f"{len(prof.cluster.nodes)} node(s) ready")


@cluster_app.command("up")
def cluster_up(
    profile: ProfileOpt = None,
    set_: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            metavar="KNOB=VALUE",
            help="deploy the champion with this change (repeatable); if it fails, the champion "
            "is restored when the profile says restore_champion",
        ),
    ] = None,
) -> None:
    """Deploy the champion (or the profile's starting config) and leave it running.

    On failure every node is torn down and the command exits with the failure's code.
    """
    prof = load_profile(profile)
    ledger = Ledger(Settings.resolve(prof).ledger_url)
    champion = ledger.champion(prof.cluster.name)
    base = champion.config if champion else prof.initial_champion()
    config = base
    for item in set_ or []:
        knob, sep, value = item.partition("=")
        if not sep:
            raise UsageError(f"--set {item!r}: expected KNOB=VALUE")
        config = config.apply(prof.space.change(config, knob, value))
    fallback = base if set_ and prof.restore_champion else None
    console = _out()
    deployer = deployer_for(prof, progress=lambda msg: console.print(f"  {msg}", style="dim"))
    try:
        with ClusterLease(ledger, prof.cluster.name):
            attempt = deployer.attempt(config, fallback=fallback)
    finally:
        deployer.close()
    if attempt.failure is not None:
        for rank, how in sorted(attempt.teardown.items()):
            console.print(f"  node-{rank}: {how}")
        if attempt.restored is not None:
            console.print(f"champion restored at {prof.cluster.base_url} (config {base.key})")
        elif attempt.restore_failure is not None:
            console.print(f"champion NOT restored: {attempt.restore_failure.message}")
        raise attempt.failure
    assert attempt.result is not None
    console.print(
        f"up in {attempt.result.boot_seconds:.1f}s at {prof.cluster.base_url} (config {config.key})"
    )


@cluster_app.command("down")
def cluster_down(profile: ProfileOpt = None) -> None:
    """Stop the engine on every node (head first), confirming each is gone; a node that
    cannot be reached is reported and the others are still stopped."""
    prof = load_profile(profile)
    deployer = deployer_for(prof)
    try:
        outcomes, errors = deployer.stop_each()
    finally:
        deployer.close()
    for rank, how in sorted(outcomes.items()):
        typer.echo(f"node-{rank}: {how}")
    if errors:
        raise errors[0]


@cluster_app.command("status")
def cluster_status(profile: ProfileOpt = None) -> None:
    """Which nodes have an engine running (and which cannot be reached)."""
    prof = load_profile(profile)
    deployer = deployer_for(prof)
    try:
        reached = deployer.reach()
        for node in sorted(prof.cluster.nodes, key=lambda n: n.rank):
            err = reached[node.rank]
            state = err.message if err else ("running" if deployer.alive(node) else "stopped")
            typer.echo(f"{node.name} ({node.host}): {state}")
    finally:
        deployer.close()
    failed = [e for _, e in sorted(reached.items()) if e is not None]
    if failed:
        raise failed[0]


@app.command()
def bench(profile: ProfileOpt = None, as_json: JsonOpt = False) -> None:
    """Run the profile's cells against what is deployed now."""
    prof = load_profile(profile)
    deployer = deployer_for(prof)
    results = [
        run_cell(prof.cluster.base_url, prof.model, cell, clocks=deployer.clocks)
        for cell in prof.cells
    ]
    if as_json:
        typer.echo(json.dumps([r.model_dump(mode="json") for r in results], indent=2))
        return
    for r in results:
        accepted = "-" if r.accepted_per_step is None else f"{r.accepted_per_step:.2f}"
        typer.echo(
            f"{r.cell}: {r.output_throughput:.1f} tok/s, TTFT p90 {r.p90_ttft_ms:.0f} ms, "
            f"accepted/step {accepted}, errors {r.errors}"
        )


@twin_app.command(
    "serve",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
)
def twin_serve(ctx: typer.Context) -> None:
    """Run the twin engine (takes `vllm serve` flags; what a twin launcher runs)."""
    code = twin_cli.main(["serve", *ctx.args])
    if code:
        raise typer.Exit(code)


@twin_app.command("optimum")
def twin_optimum(
    landscape: Annotated[
        str | None,
        typer.Option(help="landscape YAML path or shipped name (default: the profile's)"),
    ] = None,
    profile: ProfileOpt = None,
) -> None:
    """Print the ground truth of a landscape: best valid config and its noise-free objective."""
    name = landscape
    if name is None:
        name = load_profile(profile).twin_landscape or "vllm-dflash2-tp4"
    code = twin_cli.main(["optimum", "--landscape", name])
    if code:
        raise typer.Exit(code)


def run(argv: list[str] | None = None) -> int:
    """Run the CLI; the exit code (errors as one ``Error: …`` line on stderr)."""
    return run_app(app, argv, "orchestrate")


def main() -> None:
    """Console-script entry point."""
    sys.exit(run())
