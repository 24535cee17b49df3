"""What every ``orchestrate`` command shares: its options, its console, and ``opened``, which
opens the ledger and the deployer a command uses and closes them on every path.

The command modules import typer, rich and this project's error root at their top, and the rest
(the ledger, the profile, the proposers, SSH) inside the commands that use it: ``orchestrate
--help`` and each TAB of shell completion build every command's signature, and would otherwise
load SQLAlchemy, Optuna, MLflow and paramiko to print a page of help (tests/test_cli_startup.py).
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from orchestrator.profile_names import embedded_profiles

if TYPE_CHECKING:
    from cluster.deploy import Deployer
    from cluster.nodes import Fence, Progress
    from ledger import Ledger, LedgerNotReady
    from orchestrator.profile import Profile


def completes(words: Callable[[], list[str]]) -> Callable[[str], list[str]]:
    """Shell completion of an option's value: ``words()`` that start with what is typed (none:
    the shell completes file names, as the completion script asks it to)."""

    def complete(incomplete: str) -> list[str]:
        return [w for w in words() if w.startswith(incomplete)]

    return complete


def one_of(option: str, known: Callable[[], Sequence[str]]) -> Callable[[str | None], str | None]:
    """A typer callback taking the option's value only if it is one of ``known()``: else one
    line naming the value and the option, the values there are and what it is a typo of
    (``knobs.names``, the policy every "did you mean" follows), as a knob's value is refused
    (``KnobSpec.parse``); exit 2, before the command opens anything."""

    def check(value: str | None) -> str | None:
        from knobs.names import did_you_mean
        from knobs.spec import printable
        from orchestrator.errors import UsageError

        words = list(known())
        if value is None or value in words:
            return value
        hint = did_you_mean(value, words)
        said = f"{option} {printable(value)} is not one of {', '.join(words)}"
        raise UsageError(said if hint is None else f"{said}; {hint}")

    return check


ProfileOpt = Annotated[
    str | None,
    typer.Option(
        "--profile",
        "-p",
        help="profile YAML path or embedded name (default: $ORCHESTRATE_PROFILE, else twin)",
        envvar="ORCHESTRATE_PROFILE",
        show_envvar=False,
        autocompletion=completes(embedded_profiles),
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="print JSON for scripts")]


def _vetoed_for(reason: str) -> str:
    """A proposal's veto reason, which every proposer is shown: words, or a usage error (as
    ``experiments veto`` and ``known-bad clear`` refuse a blank one)."""
    if not reason.strip():
        raise typer.BadParameter("it must say why the proposal is vetoed (every proposer sees it)")
    return reason.strip()


VetoReason = Annotated[
    str, typer.Option("--reason", help="why (shown to every proposer)", callback=_vetoed_for)
]
#: The largest ID (or seed) a command takes: what the ledger's integers hold (SQLite's and
#: PostgreSQL's BIGINT); a larger one is a usage error in one line, not an overflow.
ID_MAX = 2**63 - 1


def in_ledger(value: int | None) -> int | None:
    """An ID's or a seed's callback: past ``ID_MAX`` is a usage error. It stands for typer's
    ``max=ID_MAX``, which ``--help`` would show as ``[0<=x<=9223372036854775807]``, a token
    wider than its column, folded mid-number; without it the column reads ``[x>=0]``."""
    if value is not None and value > ID_MAX:
        raise typer.BadParameter(
            f"Input should be less than or equal to {ID_MAX} (the largest integer the ledger holds)"
        )
    return value


def readable(doc: str) -> str:
    """A command's docstring as its ``--help`` shows it: typer's rich help keeps a docstring's
    line breaks (a sentence broken where the source wrapped it, at any terminal width), so each
    paragraph's lines are joined and the terminal wraps them; reST's ``code`` is shown as the
    rest of the help quotes code, `code`. Paragraphs stay paragraphs."""
    paragraphs = inspect.cleandoc(doc).split("\n\n")
    joined = "\n\n".join(" ".join(p.split()) for p in paragraphs)
    return re.sub(r"``([^`]+)``", r"`\1`", joined)


def make_readable(app: typer.Typer) -> None:
    """Every command's help under ``app``, its groups' too, made ``readable`` (their
    docstrings stay as written)."""
    for command in app.registered_commands:
        doc = command.help or inspect.getdoc(command.callback) or ""
        command.help = readable(doc)
    for group in app.registered_groups:
        if group.typer_instance is not None:
            make_readable(group.typer_instance)


def out() -> Console:
    """The console a command prints its result on (stdout, no markup highlighting)."""
    return Console(highlight=False, soft_wrap=True)


class Opened:
    """The ledger and deployers of one command, each opened on first use (so a command opens
    what it needs when it needs it, in the order it needs it) and closed by ``opened``."""

    def __init__(self, profile: Profile, stack: ExitStack) -> None:
        from orchestrator.settings import Settings

        self.profile = profile
        self.settings = Settings.resolve(profile)
        self._stack = stack
        self._ledger: Ledger | None = None

    def ledger(self, *, create: bool = True) -> Ledger:
        """The profile's ledger (``ORCHESTRATE_LEDGER`` first), opened on the first call (and
        upgraded, if an older release wrote it). ``create=False``: for a command that only
        reads it, or that fails before it writes where there is none (a proposal, an
        experiment named by its ID): no ledger there is said, and none is created (no SQLite
        file, no tables).

        Raises:
            LedgerNotReady: not ``create``, and no ledger there yet (``no_ledger_yet``).
            LedgerError: as ``Ledger``.
        """
        if self._ledger is None:
            from ledger import Ledger, LedgerNotReady
            from orchestrator import stacks
            from orchestrator.contacts import remember_ledger

            if not create:
                try:  # read, writing nothing: the probe ``cluster down``'s cleanup makes too
                    Ledger(self.settings.ledger_url, read_only=True).close()
                except LedgerNotReady as e:
                    if e.found is None:
                        # its server answered, though it holds no ledger yet: reached
                        remember_ledger(self.settings.ledger_url)
                        raise no_ledger_yet(e) from e
                    # an older release's: upgraded as any command that opens it does

            self._ledger = self._stack.enter_context(Ledger(self.settings.ledger_url))
            self._another_stacks(self._ledger)
            stacks.check(self.profile, self._ledger)  # another stack under its cluster's name
            # a ledger server reached once is waited for when it does not answer a round's
            # start (``outages.waiting_for_ledger``)
            remember_ledger(self.settings.ledger_url)
            if self._ledger.upgraded is not None:
                # said once, on stderr: a --json command's stdout stays JSON
                Console(stderr=True).print(self._ledger.upgraded.line(), markup=False)
        return self._ledger

    def _another_stacks(self, ledger: Ledger) -> None:
        """A command given no profile reads the embedded twin's cluster: on a ledger that holds
        other clusters and not that one, its answer (no proposal waiting, an empty
        results.tsv written over the real one) would be about nothing, with exit 0.

        Raises:
            UsageError: the default profile's cluster is not in a ledger that holds others.
        """
        from orchestrator.errors import UsageError

        if not self.profile.by_default:
            return
        clusters = ledger.clusters()
        if clusters and self.profile.cluster.name not in clusters:
            raise UsageError(
                f"no --profile given, and the ledger {ledger.url} "
                f"holds no cluster {self.profile.cluster.name} (the default profile's); it "
                f"holds {', '.join(clusters)}: pass --profile FILE (or set "
                "ORCHESTRATE_PROFILE=FILE for this shell)"
            )

    def deployer(self, *, progress: Progress | None = None, fence: Fence | None = None) -> Deployer:
        """A deployer for the profile's cluster (its transports connect on first use), with
        ``fence`` asked right before each node is stopped or started."""
        from orchestrator.testbed import deployer_for

        deployer = deployer_for(self.profile, progress=progress, fence=fence)
        self._stack.callback(deployer.close)
        return deployer


def no_ledger_yet(e: LedgerNotReady) -> LedgerNotReady:
    """The one line a command that needs a ledger says where there is none: where it looked,
    and what creates one or names another."""
    from ledger import LedgerNotReady

    return LedgerNotReady(
        f"{e.message}: `orchestrate round` creates it (ORCHESTRATE_LEDGER or the profile's "
        "ledger_url names another)",
        url=e.url,
    )


@contextmanager
def reading(url: str) -> Iterator[Ledger]:
    """The ledger at ``url``, to read, changing nothing (``ledger.reading``: an older one
    read as upgraded and left as it was); no ledger there said as ``no_ledger_yet`` says it.

    Raises:
        LedgerNotReady: no ledger there.
        LedgerError: as ``ledger.reading``.
    """
    from ledger import LedgerNotReady
    from ledger import reading as read

    with ExitStack() as stack:
        try:
            ledger = stack.enter_context(read(url))
        except LedgerNotReady as e:
            raise no_ledger_yet(e) from e
        yield ledger


@contextmanager
def opened(profile: Profile) -> Iterator[Opened]:
    """``with opened(prof) as o:`` … ``o.ledger()``, ``o.deployer()``: whatever was opened is
    closed when the block ends, by an error or an interrupt too (the last opened first)."""
    with ExitStack() as stack:
        yield Opened(profile, stack)
