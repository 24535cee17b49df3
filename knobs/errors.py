"""The errors of knobs and profiles: an unknown knob, a value outside its domain, a profile
that does not load. The root, ``OrchestrateError``, is ``orchestrator.errors``'s."""

from __future__ import annotations

from orchestrator.errors import OrchestrateError


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
