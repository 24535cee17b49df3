"""``orchestrate bench``: the profile's cells against what is deployed now."""

from __future__ import annotations

import json

import typer

from orchestrator.cli.common import JsonOpt, ProfileOpt, opened


def bench(profile: ProfileOpt = None, as_json: JsonOpt = False) -> None:
    """Run the profile's cells against what is deployed now. Why a cell waits past its window
    or measures again (a silent engine, a busy host) is said on stderr as it happens."""
    from cluster.bench import run_cell
    from orchestrator.profile import load_profile

    prof = load_profile(profile)
    with opened(prof) as o:
        deployer = o.deployer()
        results = [
            run_cell(
                prof.cluster.base_url,
                prof.model,
                cell,
                clocks=deployer.clocks,
                on_notice=lambda line: typer.echo(line, err=True),
                hang_after_s=prof.bench.hang_after_s,
            )
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
