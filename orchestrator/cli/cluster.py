"""``orchestrate cluster``: preflight, deploy, stop and inspect the profile's cluster by hand."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated

import typer

from orchestrator.cli.common import Opened, ProfileOpt, opened, out
from orchestrator.errors import UsageError

if TYPE_CHECKING:
    from cluster.errors import NodeError
    from knobs.config import Config
    from knobs.spec import Value
    from ledger import Ledger
    from orchestrator.faults import RefitChampionFailing
    from orchestrator.lease import Ownership
    from orchestrator.profile import Profile

ForceOpt = Annotated[
    bool,
    typer.Option(
        "--force",
        help="break another orchestrator's claim on the nodes, stale or live (recorded in the "
        "ledger); without it a live claim refuses the command",
    ),
]

cluster_app = typer.Typer(help="Drive the profile's cluster by hand.", no_args_is_help=True)


@cluster_app.command("check")
def cluster_check(profile: ProfileOpt = None) -> None:
    """Preflight every node: reachable (SSH: host key, auth), its workdir can be made and
    written, its address on the cluster interface, free memory settled, clocks healthy.
    Changes nothing (what the workdir check makes, it removes)."""
    from cluster.errors import of_node
    from cluster.workdir import every_workdir
    from orchestrator.profile import load_profile

    prof = load_profile(profile)
    with opened(prof) as o:
        deployer = o.deployer()
        reached = deployer.reach()
        for rank, err in sorted(reached.items()):
            typer.echo(of_node(f"node-{rank}", "reachable" if err is None else err.message))
        answered = [n for n in prof.cluster.nodes if reached[n.rank] is None]
        written = every_workdir(answered, deployer.transports)
        for node in sorted(answered, key=lambda n: n.rank):
            err = written[node.rank]
            typer.echo(
                of_node(
                    node.name,
                    f"workdir {node.workdir} can be written" if err is None else err.message,
                )
            )
        failed = [e for _, e in sorted(reached.items()) if e is not None]
        failed += [e for _, e in sorted(written.items()) if e is not None]
        if failed:
            raise failed[0]
        for clock in deployer.preflight():
            typer.echo(
                f"node-{clock.rank}: sm clock {clock.sm_clock_mhz:.0f} MHz, "
                f"matmul rate {clock.matmul_rate:.2f}"
            )
    typer.echo(f"{len(prof.cluster.nodes)} node(s) ready")


@cluster_app.command("up")
def cluster_up(
    profile: ProfileOpt = None,
    set_: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            metavar="KNOB=VALUE",
            help="deploy the champion with this change (repeatable, applied together: the "
            "profile's forbidden combinations are checked on the result); if it fails, the "
            "champion is restored when the profile says restore_champion",
        ),
    ] = None,
    force: ForceOpt = False,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="print each node's launcher script for the config `cluster up` would deploy "
            "(the ledger's champion, read without writing, else the profile's starting config; "
            "with any --set), workers first, and touch nothing: no node, no claim, no ledger "
            "write",
        ),
    ] = False,
) -> None:
    """Deploy the champion (or the profile's starting config) and leave it running.

    The nodes are claimed while it deploys (refused while another orchestrator holds them)
    and released after: the engines stay up, unclaimed. On failure every node is torn down
    and the command exits with the failure's code; a champion that fails as the profile
    renders it now, having lost or gained a knob since it was measured, is the profile's
    (exit 3, the line naming the knob).
    """
    from cluster.launcher import render_node
    from cluster.teardown import said
    from orchestrator.evolution import fit_champion, record_profile
    from orchestrator.profile import load_profile
    from orchestrator.profile_champion import said_once
    from orchestrator.settings import runtime_placeholders

    prof = load_profile(profile)
    sets = _sets(prof, set_)  # a typo said before the ledger or a node is touched
    console = out()
    if dry_run:
        base, whence = _would_deploy(prof)
        config = _with_sets(prof, base, sets)
        for node in sorted(prof.cluster.nodes, key=lambda n: (n.rank == 0, -n.rank)):
            rendered = render_node(
                prof.launcher, prof.space, config, prof.cluster, node, runtime_placeholders()
            )
            console.print(f"# {node.name} ({node.host}):", markup=False)
            console.print(rendered.script, markup=False)
        console.print(
            f"# config {config.key} ({whence}{' with --set' if set_ else ''}): workers first, "
            "the head last; nothing was started",
            markup=False,
        )
        return
    with opened(prof) as o:
        ledger = o.ledger()
        champion = ledger.champion(prof.cluster.name)
        # champion: edited since the ledger has a champion: not what is deployed, said once
        ignored = said_once(
            prof, ledger, None if champion is None else fit_champion(prof.space, ledger, champion)
        )
        if ignored is not None:
            console.print(ignored, markup=False)
        # recorded under an earlier profile: fitted to this one, what changed said and recorded
        for line in record_profile(prof, ledger):
            console.print(line)
        champion = None if champion is None else fit_champion(prof.space, ledger, champion)
        base = champion.config if champion else prof.initial_champion()
        config = _with_sets(prof, base, sets)
        fallback = base if sets and prof.restore_champion else None
        deployer = o.deployer(progress=lambda msg: console.print(f"  {msg}", style="dim"))
        with _owned(o, "cluster up", force, console.print):
            attempt = deployer.attempt(config, fallback=fallback)
        # the champion itself failing as the profile renders it now: what it deployed, or,
        # with --set, what the restore after a failed --set config deployed
        refit = restore_refit = None
        if champion is not None and not set_ and attempt.failure is not None:
            refit = _refit_failing(prof, o.ledger(), champion.experiment_id, attempt.failure)
        if champion is not None and attempt.restore_failure is not None:
            restore_refit = _refit_failing(
                prof, o.ledger(), champion.experiment_id, attempt.restore_failure
            )
    if attempt.failure is not None:
        for rank, how in sorted(attempt.teardown.items()):
            console.print(f"  {said(f'node-{rank}', how)}", markup=False)
        if attempt.restored is not None:
            console.print(f"champion restored at {prof.cluster.base_url} (config {base.key})")
        elif attempt.restore_failure is not None:
            restore = restore_refit or attempt.restore_failure
            console.print(f"champion NOT restored: {restore.message}", markup=False)
        raise refit or attempt.failure
    assert attempt.result is not None
    console.print(
        f"up in {attempt.result.boot_seconds:.1f}s at {prof.cluster.base_url} (config {config.key})"
    )


def _refit_failing(
    prof: Profile, ledger: Ledger, champion: int, failure: NodeError
) -> RefitChampionFailing | None:
    """The error of champion experiment ``champion`` failing to come up (``failure``) as the
    profile renders it now, when the profile's change explains it (``evolution.refit_blame``:
    a knob lost or gained since it was measured, and no boot of it so came up); ``None`` for
    a failure of the infrastructure's, or one the profile's change does not explain."""
    from knobs.vocabulary import INFRASTRUCTURE
    from orchestrator.evolution import refit_blame
    from orchestrator.faults import RefitChampionFailing

    if failure.failure_class in INFRASTRUCTURE:
        return None
    blame = refit_blame(prof, ledger, ledger.experiment(champion))
    if blame is None:
        return None
    return RefitChampionFailing(
        blame.line(
            f"the champion (experiment #{champion}) failed to come up "
            f"({failure.failure_class}: {failure.message})"
        ),
        failure=failure,
        experiment=None,
        removed=dict(blame.removed),
        added=dict(blame.added),
    )


def _would_deploy(prof: Profile) -> tuple[Config, str]:
    """The config ``cluster up`` would deploy and whence: the ledger's champion fitted to this
    profile, the ledger only read (``ledger.reading``: a dry run creates, upgrades and records
    nothing; an older SQLite ledger is read through an upgraded copy, an older PostgreSQL one
    upgraded inside a transaction that is rolled back), else the profile's starting config and
    why."""
    from ledger import LedgerError, reading
    from orchestrator import knob_renames
    from orchestrator.evolution import fit_champion
    from orchestrator.settings import Settings

    url = Settings.resolve(prof).ledger_url
    try:
        with reading(url) as ledger:
            knob_renames.check(prof, ledger)  # a knob renamed unsaid: refused, as a run is
            champion = ledger.champion(prof.cluster.name)
            fitted = None if champion is None else fit_champion(prof.space, ledger, champion)
    except LedgerError as e:  # not there yet, a newer schema, unreadable: nothing to deploy
        return prof.initial_champion(), f"the profile's starting config: {e.message}"
    if fitted is None:
        return prof.initial_champion(), "the profile's starting config: no champion yet"
    return fitted.config, f"the ledger's champion, experiment #{fitted.experiment_id}"


def _with_sets(prof: Profile, config: Config, sets: dict[str, Value]) -> Config:
    """``config`` with every ``--set`` (``_sets``) applied together: the profile's forbidden
    combinations are checked on the result, so knobs that may only move together (an engine's
    linked parameters) can be set together.

    Raises:
        KnobError: a forbidden result.
    """
    return prof.space.config({**config.as_dict(), **sets}) if sets else config


def _sets(prof: Profile, sets: list[str] | None) -> dict[str, Value]:
    """Each ``KNOB=VALUE`` of ``--set``, the value typed by its knob: read before anything is
    opened, so that a typo touches neither the ledger nor a node.

    Raises:
        UsageError: an item that is no ``KNOB=VALUE``, or one knob set twice.
        KnobError: an unknown knob or a value out of its domain, the item named, with what it
            is a typo of (``knobs.names``).
    """
    from knobs.errors import KnobError
    from knobs.spec import printable

    values: dict[str, Value] = {}
    for item in sets or ():
        knob, sep, value = item.partition("=")
        if not sep:
            raise UsageError(f"--set {item!r}: expected KNOB=VALUE")
        try:
            spec = prof.space.spec(knob)
            if spec.name in values:
                raise UsageError(f"--set {spec.name} is given twice: set each knob once")
            values[spec.name] = spec.parse(value)
        except KnobError as e:
            shown = item if item.isprintable() else printable(item)
            raise KnobError(f"--set {shown}: {e.message}", knob=e.knob, value=e.value) from None
    return values


@cluster_app.command("down")
def cluster_down(profile: ProfileOpt = None, force: ForceOpt = False) -> None:
    """Stop the engine on every node (head first), confirming each is gone; a node that
    cannot be reached is reported and the others are still stopped. Refused while another
    orchestrator (a running round) claims the nodes, unless --force."""
    from cluster.teardown import said
    from orchestrator.interrupts import unbroken
    from orchestrator.profile import load_profile

    prof = load_profile(profile)
    # once the stops begin, a signal waits for them and for the boots' closing
    with (
        opened(prof) as o,
        _owned(o, "cluster down", force, typer.echo, lease=False) as owner,
        unbroken(),
    ):
        outcomes, errors = o.deployer().stop_each()
        for rank, how in sorted(outcomes.items()):
            typer.echo(said(f"node-{rank}", how))
        if not errors:
            _close_left_open(o, owner, typer.echo)
    if errors:
        raise errors[0]


def _close_left_open(o: Opened, owner: Ownership, note: Callable[[str], None]) -> None:
    """Every node stopped: the boots a killed run left open in the ledger are closed (``down``,
    as a resume's cleanup closes them), so ``status`` stops calling them open and they stop
    counting GPU-hours. Nothing where there is no ledger yet (none is created) or a round holds
    the cluster's lease (its boots are its own), unless this command broke that round's claims
    (``--force``): it stopped that round's engines, so it closes its boots, naming itself (the
    round stops at its next safe point). A ledger that does not answer leaves them for the next
    round's cleanup, said in a line, and the command still succeeds."""
    from knobs.vocabulary import BOOT_CLAIM_LOST, BOOT_CLOSED_BY_DOWN, BootStatus
    from ledger import Ledger, LedgerError, LedgerNotReady
    from orchestrator.lease import forced, held

    try:
        Ledger(o.settings.ledger_url, read_only=True).close()
        ledger = o.ledger()
        cluster = o.profile.cluster.name
        lease = ledger.lease(cluster)
        broke = owner.broke(lease)
        if held(lease) and broke is None:
            return
        me = owner.holder
        detail = (
            BOOT_CLOSED_BY_DOWN
            if broke is None
            else BOOT_CLAIM_LOST
            + f"{forced(me.what, me.user, me.hostname, me.pid)} broke the claims of its "
            f"{broke.what} (pid {broke.pid}) and stopped its engines"
        )
        left = [
            boot
            for boot in ledger.open_boots(cluster)
            if ledger.end_boot(boot.id, status=BootStatus.DOWN, failure_detail=detail, if_open=True)
        ]
    except LedgerNotReady:
        return  # no ledger here (or one an older release wrote, which the next round upgrades)
    except LedgerError as e:
        note(
            f"the ledger did not answer ({e.message}): the boots a killed run left open stay "
            "open there until the next round's cleanup"
        )
        return
    if left and broke is not None:
        note(
            f"closed {len(left)} boot(s) of the {broke.what} whose claims this command broke "
            f"(pid {broke.pid} on {broke.hostname}): it stops at its next safe point"
        )
    elif left:
        note(f"closed {len(left)} boot(s) a killed run had left open in the ledger")


@cluster_app.command("status")
def cluster_status(profile: ProfileOpt = None) -> None:
    """Which nodes have an engine running (and which cannot be reached)."""
    from cluster.errors import of_node
    from orchestrator.profile import load_profile

    prof = load_profile(profile)
    with opened(prof) as o:
        deployer = o.deployer()
        reached = deployer.reach()
        for node in sorted(prof.cluster.nodes, key=lambda n: n.rank):
            err = reached[node.rank]
            state = "running" if err is None and deployer.alive(node) else "stopped"
            typer.echo(
                of_node(node.name, err.message) if err else f"{node.name} ({node.host}): {state}"
            )
    if not any(reached.values()):
        note = _never_deployed(prof)
        if note:
            typer.echo(note)
    failed = [e for _, e in sorted(reached.items()) if e is not None]
    if failed:
        raise failed[0]


def _never_deployed(prof: Profile) -> str | None:
    """The line for a cluster of local nodes none of which has its workdir (nothing was ever
    deployed from this folder: the embedded cluster lives in the folder it was deployed
    from), or None. Reading creates nothing, so the folder stays as it was."""
    import os
    from pathlib import Path

    nodes = prof.cluster.nodes
    if any(n.transport != "local" or Path(n.workdir).exists() for n in nodes):
        return None
    head = prof.cluster.head.workdir
    shown = os.path.relpath(head) if head.startswith(os.getcwd() + os.sep) else head
    return (
        f"nothing was deployed here ({shown} is not there): `orchestrate cluster up` deploys "
        "the champion, `orchestrate round` runs a round; a cluster deployed from another "
        "folder is seen from that folder"
    )


def _owned(
    o: Opened, what: str, force: bool, note: Callable[[str], None], *, lease: bool = True
) -> Ownership:
    """The ledger's lease (with ``lease``) and a claim on every node while a command drives
    them (issue #17); a node that cannot be reached is left unclaimed, as the command reports
    it. The ledger opens only if ``lease`` or a claim broken by ``force`` needs it."""
    from orchestrator.lease import Ownership
    from orchestrator.settings import lease_ttl_s

    return Ownership(
        o.profile.cluster,
        what=what,
        ledger_url=o.settings.ledger_url,
        ledger=o.ledger,
        lease=lease,
        force=force,
        note=note,
        skip_unreachable=True,
        ttl_s=lease_ttl_s(),
    )
