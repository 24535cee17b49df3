"""``orchestrate status``: the champion, the unfinished round (and why it stopped short, if it
did), the last round's boots paid, measurements weighed and boots a busy host disturbed (as
its report counts them), what MLflow still lacks, a node whose clocks are off more often than
chance explains, the boots each node failed for the infrastructure's reasons, the lease, and
a stop the ledger could not record (``orchestrator.unrecorded``).

``seen`` reads the ledger once, ``payload`` makes ``--json`` of it, ``text`` says it."""

from __future__ import annotations

import json
import shlex
from typing import TYPE_CHECKING

import typer
from rich.console import Console

from orchestrator.cli.common import JsonOpt, ProfileOpt, opened, out, reading

if TYPE_CHECKING:
    from orchestrator.stacks import AnotherStack


def status(profile: ProfileOpt = None, as_json: JsonOpt = False) -> None:
    """The champion, the running round, budget spent and who holds the cluster's lease."""
    from ledger import Ledger, LedgerError, ledger_identity
    from ledger.mlflow_sink import mlflow_experiment
    from orchestrator.cli.status.payload import as_data
    from orchestrator.cli.status.seen import read
    from orchestrator.cli.status.text import say_champion, say_nodes, say_round
    from orchestrator.mlflow_store import seen_from_here
    from orchestrator.profile import load_profile
    from orchestrator.stacks import AnotherStack
    from orchestrator.unrecorded import found

    prof = load_profile(profile)
    with opened(prof) as o:
        url = o.settings.ledger_url
        # the stops the ledger could not hold (its disk read-only or full, its server away)
        kept = found(url, prof.cluster.name)
        unwritable: str | None = None
        try:
            seen = read(prof, o.ledger(create=False))
        except AnotherStack as e:
            # refused as round refuses it (exit 3), after what the ledger holds of the cluster
            _another_stack(url, e, prof.name, as_json)
            raise
        except LedgerError as e:
            if not e.read_only:
                # those kept for this path said, whatever the ledger says now
                for unheld in kept:
                    if unheld.ledger == ledger_identity(url):
                        Console(stderr=True).print(unheld.said(), markup=False)
                raise
            # its filesystem read-only: read as it is (nothing could be upgraded there)
            unwritable = e.message
            with Ledger(url, read_only=True) as ledger:
                seen = read(prof, ledger)
    # the ledger's own, wherever it was when they were kept; those of another ledger once at
    # this path said apart (``Unrecorded.belongs``)
    stops = [k for k in kept if k.belongs(url, seen.rounds)]
    others = [k for k in kept if k not in stops and k.ledger == ledger_identity(url)]
    # the commands this status suggests, under the profile it read (the round's)
    flag = "" if profile is None else f" --profile {shlex.quote(profile)}"
    data = as_data(prof, seen, flag)
    # the MLflow store a round from here opens, glanced at: without the ledger's last run, or
    # away (``mlflow_store.seen_from_here``)
    store = seen_from_here(o.settings.mlflow_uri, seen.rounds, mlflow_experiment(prof.cluster.name))
    data["other_mlflow_store"] = store.other
    data["mlflow_away"] = store.away
    data["unrecorded_stop"] = stops[-1].as_json() if stops else None  # the last
    data["unrecorded_stops"] = [k.as_json() for k in stops]
    # the ledger's filesystem is read-only: read as it is, and no round can write to it
    data["ledger_read_only"] = unwritable
    if as_json:
        typer.echo(json.dumps(data, indent=2))
        return
    console = out()
    say_champion(console, seen)
    say_round(console, seen, data, flag)
    for line in [k.said() for k in stops] + [k.elsewhere() for k in others]:
        console.print(line, markup=False)
    if unwritable is not None:
        console.print(
            f"read as it is; no round can write to it until then: {unwritable}", markup=False
        )
    say_nodes(console, prof, seen, data, flag)
    for said in (store.other, store.away):
        if said is not None:
            console.print(said, markup=False)


def _another_stack(url: str, refused: AnotherStack, profile: str, as_json: bool) -> None:
    """What the ledger at ``url`` holds of the cluster another stack's ``profile`` was
    ``refused`` for, read as recorded (``stacks.recorded``): its text, or ``--json``."""
    from orchestrator.stacks import recorded, recorded_words

    with reading(url) as ledger:
        held = recorded(ledger, refused)
    if as_json:
        typer.echo(json.dumps({"another_stack": refused.message, "recorded": held}, indent=2))
        return
    console = out()
    for line in recorded_words(held, profile):
        console.print(line, markup=False)
