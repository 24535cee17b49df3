"""What every ``orchestrate`` command shares: its options, its console, and ``opened``, which
opens the ledger and the deployer a command uses and closes them on every path.

The command modules import typer, rich and this project's error root at their top, and the rest
(the ledger, the profile, the proposers, SSH) inside the commands that use it: ``orchestrate
--help`` and each TAB of shell completion build every command's signature, and would otherwise
load SQLAlchemy, Optuna, MLflow and paramiko to print a page of help (tests/test_cli_startup.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from orchestrator.profile_names import embedded_profiles

if TYPE_CHECKING:
    from cluster.deploy import Deployer, Progress
    from ledger import Ledger
    from orchestrator.profile import Profile


def completes(words: Callable[[], list[str]]) -> Callable[[str], list[str]]:
    """Shell completion of an option's value: ``words()`` that start with what is typed (none:
    the shell completes file names, as the completion script asks it to)."""

    def complete(incomplete: str) -> list[str]:
        return [w for w in words() if w.startswith(incomplete)]

    return complete


ProfileOpt = Annotated[
    str | None,
    typer.Option(
        "--profile",
        "-p",
        help="profile YAML path or embedded name (default: twin)",
        autocompletion=completes(embedded_profiles),
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="print JSON for scripts")]
#: The largest ID (or seed) a command takes: what the ledger's integers hold (SQLite's and
#: PostgreSQL's BIGINT); a larger one is a usage error in one line, not an overflow.
ID_MAX = 2**63 - 1


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

    def ledger(self) -> Ledger:
        """The profile's ledger (``ORCHESTRATE_LEDGER`` first), opened on the first call."""
        if self._ledger is None:
            from ledger import Ledger
            from orchestrator.contacts import remember_ledger

            self._ledger = self._stack.enter_context(Ledger(self.settings.ledger_url))
            # a ledger server reached once is waited for when it does not answer a round's
            # start (``faults.waiting_for_ledger``)
            remember_ledger(self.settings.ledger_url)
            if self._ledger.upgraded is not None:
                # said once, on stderr: a --json command's stdout stays JSON
                Console(stderr=True).print(self._ledger.upgraded.line(), markup=False)
        return self._ledger

    def deployer(self, *, progress: Progress | None = None) -> Deployer:
        """A deployer for the profile's cluster (its transports connect on first use)."""
        from orchestrator.testbed import deployer_for

        deployer = deployer_for(self.profile, progress=progress)
        self._stack.callback(deployer.close)
        return deployer


@contextmanager
def opened(profile: Profile) -> Iterator[Opened]:
    """``with opened(prof) as o:`` … ``o.ledger()``, ``o.deployer()``: whatever was opened is
    closed when the block ends, by an error or an interrupt too (the last opened first)."""
    with ExitStack() as stack:
        yield Opened(profile, stack)
