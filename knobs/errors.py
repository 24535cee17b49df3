"""The one exception root of orchestrate.

It lives in ``knobs`` because every package may import ``knobs`` and nothing below it.
Each subclass carries its evidence as attributes and a class-level ``exit_code`` that the
CLI uses; library code raises, only ``orchestrator.cli`` turns an error into an exit.
"""

from __future__ import annotations

from typing import ClassVar


class OrchestrateError(Exception):
    """Root of every error orchestrate raises on purpose.

    ``exit_code`` follows the CLI contract: 1 bug, 2 usage, 3 bad profile or value, 4 ledger,
    5 node unreachable or auth, 6 remote command failed, 7 LLM API, 130 interrupted.
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


class KnobError(OrchestrateError):
    """An unknown knob, a value of the wrong type or outside its domain, a forbidden mix.

    Carries the knob name and the offending value (already made printable, never executed).
    """

    exit_code = 3

    def __init__(self, message: str, *, knob: str | None = None, value: object = None) -> None:
        super().__init__(message)
        self.knob = knob
        self.value = value


class ProfileError(OrchestrateError):
    """A profile (or landscape) that does not load or does not validate; carries its path."""

    exit_code = 3

    def __init__(self, message: str, *, path: str | None = None) -> None:
        super().__init__(message)
        self.path = path
