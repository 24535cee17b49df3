"""The ``orchestrate`` command line. The only place that turns an error into an exit code."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import click
import typer
from rich.console import Console

from agents import make_proposer
from cluster.bench import run_cell, smoke
from cluster.deploy import Deployer
from cluster.transport import open_transport
from cluster.twin import cli as twin_cli
from knobs.errors import OrchestrateError, UsageError
from knobs.spec import as_text
from ledger import ExperimentRecord, Ledger, ProposalRecord, tsv_text
from ledger.mlflow_sink import MlflowSink
from orchestrator.approval import Answer, ApprovalGate
from orchestrator.display import RoundDisplay, experiments_table
from orchestrator.lease import ClusterLease
from orchestrator.profile import Profile, load_profile
from orchestrator.round import RoundOptions, RoundRunner
from orchestrator.settings import Settings, runtime_placeholders
from orchestrator.testbed import ClusterTestbed

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

ProfileOpt = Annotated[
    str | None,
    typer.Option("--profile", "-p", help="profile YAML path or embedded name (default: twin)"),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="print JSON for scripts")]


def _out() -> Console:
    return Console(highlight=False, soft_wrap=True)


def _deployer(profile: Profile, progress: Any = None) -> Deployer:
    transports = {n.rank: open_transport(n) for n in profile.cluster.nodes}
    return Deployer(
        profile.cluster,
        profile.launcher,
        profile.space,
        profile.gates,
        transports,
        model=profile.model,
        runtime=runtime_placeholders(),
        smoke=lambda url, model, prompt, n: smoke(url, model, prompt=prompt, max_tokens=n),
        progress=progress,
    )


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


def _ask_at_terminal(console: Console) -> Any:
    def ask(p: ProposalRecord, problem: str | None) -> Answer:
        if problem:
            console.print(f"[red]{problem}[/red]")
        else:
            console.print(
                f"\n[bold]Proposal {p.id}[/bold] ({p.source}): "
                f"[bold]{p.knob}[/bold] {as_text(p.old_value)} → {as_text(p.new_value)}\n"
                f"  hypothesis: {p.hypothesis or '-'}\n"
                f"  expected:   {p.expected_effect or '-'}\n"
                f"  risk:       {p.risk or '-'}\n"
                f"  cost:       {p.estimated_cost or '-'}"
            )
        action = typer.prompt("approve, edit or veto", default="approve").strip().lower()
        action = {"a": "approve", "e": "edit", "v": "veto"}.get(action, action)
        if action == "edit":
            return Answer("edit", value=typer.prompt(f"new value for {p.knob}"))
        if action == "veto":
            return Answer("veto", reason=typer.prompt("reason"))
        return Answer(action)

    return ask


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
    sweep = {"changes": prof.proposer.sweep} if prof.proposer.sweep else {}
    proposer_obj = make_proposer(kind, seed=options.seed, options=sweep)
    console = Console(stderr=True) if as_json else _out()
    asker = _ask_at_terminal(console) if mode == "ask" and sys.stdin.isatty() else None
    if mode == "ask" and asker is None and not as_json:
        asker = _ask_at_terminal(console)
    ledger = Ledger(settings.ledger_url)
    gate = ApprovalGate(ledger, mode, asker=asker)
    sink = MlflowSink(settings.mlflow_uri, artifact_root=settings.artifact_root)
    display = RoundDisplay(console)
    testbed = ClusterTestbed(
        _deployer(prof, progress=display.phase), prof.cluster.base_url, prof.model
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
    """Preflight every node: reachable, clocks healthy."""
    prof = load_profile(profile)
    deployer = _deployer(prof)
    for clock in deployer.preflight():
        typer.echo(
            f"node-{clock.rank}: sm clock {clock.sm_clock_mhz:.0f} MHz, "
            f"matmul rate {clock.matmul_rate:.2f}"
        )
    typer.echo(f"{len(prof.cluster.nodes)} node(s) ready")


@cluster_app.command("up")
def cluster_up(profile: ProfileOpt = None) -> None:
    """Deploy the champion (or the profile's starting config) and leave it running."""
    prof = load_profile(profile)
    ledger = Ledger(Settings.resolve(prof).ledger_url)
    champion = ledger.champion(prof.cluster.name)
    config = champion.config if champion else prof.initial_champion()
    console = _out()
    deployer = _deployer(prof, progress=lambda msg: console.print(f"  {msg}", style="dim"))
    with ClusterLease(ledger, prof.cluster.name):
        try:
            result = deployer.deploy(config)
        except OrchestrateError:
            deployer.stop_all()
            raise
    console.print(
        f"up in {result.boot_seconds:.1f}s at {prof.cluster.base_url} (config {config.key})"
    )


@cluster_app.command("down")
def cluster_down(profile: ProfileOpt = None) -> None:
    """Stop the engine on every node (head first), confirming each is gone."""
    prof = load_profile(profile)
    for rank, how in _deployer(prof).stop_all().items():
        typer.echo(f"node-{rank}: {how}")


@cluster_app.command("status")
def cluster_status(profile: ProfileOpt = None) -> None:
    """Which nodes have an engine running."""
    prof = load_profile(profile)
    deployer = _deployer(prof)
    for node in prof.cluster.nodes:
        typer.echo(f"{node.name} ({node.host}): {'running' if deployer.alive(node) else 'stopped'}")


@app.command()
def bench(profile: ProfileOpt = None, as_json: JsonOpt = False) -> None:
    """Run the profile's cells against what is deployed now."""
    prof = load_profile(profile)
    deployer = _deployer(prof)
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
    try:
        app(args=argv, standalone_mode=False, prog_name="orchestrate")
    except OrchestrateError as e:
        typer.echo(f"Error: {e.message}", err=True)
        return e.exit_code
    except click.exceptions.Exit as e:
        return e.exit_code
    except click.ClickException as e:
        e.show()
        return 2 if isinstance(e, click.UsageError) else e.exit_code
    except (KeyboardInterrupt, click.exceptions.Abort):
        typer.echo("Error: interrupted; run the same command again to resume", err=True)
        return 130
    return 0


def main() -> None:
    """Console-script entry point."""
    sys.exit(run())
