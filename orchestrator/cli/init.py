"""``orchestrate init --from launcher.sh``: a profile from the launcher a user already has."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from orchestrator.cli.common import out
from orchestrator.errors import UsageError


def init(
    source: Annotated[
        Path,
        typer.Option(
            "--from",
            help="the launcher: a script with a `vllm serve` line (or `docker run … "
            "--entrypoint vllm IMAGE serve …`), worker lines with --headless",
        ),
    ],
    nodes: Annotated[
        str | None,
        typer.Option(
            "--nodes",
            metavar="HOST,HOST,…",
            help="the nodes' addresses (or ~/.ssh/config aliases), head first, reached over "
            "SSH; without it, one local node",
        ),
    ] = None,
    catalog_name: Annotated[
        str, typer.Option("--catalog", help="the knob catalog to recognise")
    ] = "vllm-dflash2",
    name: Annotated[
        str | None, typer.Option("--name", help="the profile's name (default: the file's)")
    ] = None,
    dest: Annotated[
        Path | None, typer.Option("--out", help="where to write it (default: NAME.yaml)")
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="overwrite --out if it exists")] = False,
    workdir: Annotated[
        str | None,
        typer.Option(
            "--workdir",
            metavar="PATH",
            help="every node's directory for launchers, logs and pid files (default: "
            "/var/lib/orchestrate/NAME; a relative one, for a local node, is the profile's)",
        ),
    ] = None,
) -> None:
    """Write a profile from a launcher: the catalog's knobs it sets become the champion, every
    other flag and the environment stay as written, per-node values become placeholders. The
    profile is rendered back for every node and must give the launcher's own command."""
    from knobs.spec import as_text
    from orchestrator.adopt.build import adopt
    from orchestrator.settings import runtime_placeholders

    hosts = [h.strip() for h in nodes.split(",")] if nodes else None
    if hosts is not None and not all(hosts):
        raise UsageError(f"--nodes {nodes!r}: an empty address")
    adopted = adopt(
        source,
        nodes=hosts,
        catalog_name=catalog_name,
        name=name,
        runtime=runtime_placeholders(),
        workdir=workdir,
    )
    target = dest or Path(f"{adopted.profile.name}.yaml")
    if target.exists() and not force:
        raise UsageError(f"{target} exists; choose another --out or pass --force")
    if not target.parent.is_dir():
        raise UsageError(f"--out {target}: the folder {target.parent} does not exist; create it")
    target.write_text(adopted.text)
    console = out()
    champion = adopted.recognised.champion
    console.print(
        f"wrote {target}: {len(champion)} knob(s) recognised ("
        + ", ".join(f"{k}={as_text(v)}" for k, v in champion.items())
        + ")"
        # a knob the launcher sets to what the catalog cannot tune from; one it does not set
        # is untuned too, said in the file's header alone (the engine's default stands)
        + (f", {len(untuned)} left untuned" if (untuned := adopted.recognised.untuned) else "")
        + f", {len(adopted.profile.cluster.nodes)} node(s)"
    )
    for knob, why in untuned.items():  # the file's header says it too
        console.print(f"  untuned: {knob}: {why}", markup=False)
    for note in adopted.notes:
        console.print(f"  note: {note}", markup=False)
    console.print(f"check it: orchestrate cluster up --dry-run --profile {target}")
