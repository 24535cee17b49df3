"""The one exception root of orchestrate, and the error every package may raise for a command
line that asks for the impossible.

Every package imports this module (``knobs`` included, below everything else): it imports
nothing of ours, and ``orchestrator/__init__.py`` stays free of imports, so importing it loads
nothing else (import-linter holds both). Each subclass, wherever it lives, carries its evidence
as attributes and a class-level ``exit_code``; library code raises, and only the CLI
(``orchestrator.exits``) turns an error into an exit.
"""

from __future__ import annotations

from typing import ClassVar

#: The exit code of an interrupted command (128 + SIGINT, as a shell reports it): Ctrl-C, or a
#: SIGTERM or SIGHUP taken as one (``orchestrator.exits``).
INTERRUPTED = 130


class OrchestrateError(Exception):
    """Root of every error orchestrate raises on purpose.

    ``exit_code`` follows the CLI contract: 1 bug, 2 usage, 3 bad profile or value, 4 ledger,
    5 node unreachable or auth, 6 remote command failed, 7 LLM API, 8 another orchestrator
    owns the cluster (or this one lost it), 130 interrupted.
    """

    exit_code: ClassVar[int] = 1

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class UsageError(OrchestrateError):
    """The command line asks for something that cannot be done as asked."""

    exit_code = 2
