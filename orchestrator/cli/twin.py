"""``orchestrate twin``: the digital twin engine (what a twin launcher runs) and its ground
truth."""

from __future__ import annotations

from typing import Annotated

import typer

from orchestrator.cli.common import ProfileOpt

twin_app = typer.Typer(help="The digital twin engine.", no_args_is_help=True)


@twin_app.command(
    "serve",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
)
def twin_serve(ctx: typer.Context) -> None:
    """Run the twin engine (takes `vllm serve` flags; what a twin launcher runs)."""
    from cluster.twin import cli as twin_cli

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
    from cluster.twin import cli as twin_cli
    from orchestrator.profile import load_profile

    name = landscape
    if name is None:
        name = load_profile(profile).twin_landscape or "vllm-dflash2-tp4"
    code = twin_cli.main(["optimum", "--landscape", name])
    if code:
        raise typer.Exit(code)
