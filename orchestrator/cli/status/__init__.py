"""``orchestrate status``: the champion, the unfinished round (and why it stopped short, if it
did), the last round's boots paid, measurements weighed and boots a busy host disturbed (as
its report counts them), what MLflow still lacks, a node whose clocks are off more often than
chance explains, the boots each node failed for the infrastructure's reasons, and the lease.

``seen`` reads the ledger once, ``payload`` makes ``--json`` of it, ``text`` says it."""

from __future__ import annotations

import json
import shlex

import typer

from orchestrator.cli.common import JsonOpt, ProfileOpt, opened, out


def status(profile: ProfileOpt = None, as_json: JsonOpt = False) -> None:
    """The champion, the running round, budget spent and who holds the cluster's lease."""
    from orchestrator.cli.status.payload import as_data
    from orchestrator.cli.status.seen import read
    from orchestrator.cli.status.text import say_champion, say_nodes, say_round
    from orchestrator.mlflow_store import seen_from_here
    from orchestrator.profile import load_profile

    prof = load_profile(profile)
    with opened(prof) as o:
        seen = read(prof, o.ledger(create=False))
    # the commands this status suggests, under the profile it read (the round's)
    flag = "" if profile is None else f" --profile {shlex.quote(profile)}"
    data = as_data(prof, seen, flag)
    # a SQLite MLflow store, as a round from here finds it, without the ledger's last run
    data["other_mlflow_store"] = other = seen_from_here(o.settings.mlflow_uri, seen.rounds)
    if as_json:
        typer.echo(json.dumps(data, indent=2))
        return
    console = out()
    say_champion(console, seen)
    say_round(console, seen, data, flag)
    say_nodes(console, prof, seen, data, flag)
    if other is not None:
        console.print(other, markup=False)
