"""How long an LLM proposer leaves the API alone after it failed a whole proposal for the
infrastructure's reasons (``agents.llm_fallback.API_FAULTS``: timed out, unreachable,
unavailable, overloaded, a malformed response): the one home of that policy.

Without it, a dead gateway costs every proposal of the night its whole deadline again. After
such a failure the next proposals do not ask the API for a cool-off (``COOL_OFF_FIRST_S``,
doubled after each failure past a cool-off, at most ``COOL_OFF_MAX_S``); the fallback proposes
and its reason says why, in the same class (so ``status`` and the report count it there).
Past the cool-off the API is asked again; an answer (a proposal, even a refused one) ends it.
The model's own refusals never start one; a spend cap neither starts nor ends one."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Final

from agents.llm_fallback import API_FAULTS, SPEND_CAP, fallback_class, not_asked

#: The first cool-off after an infrastructure failure, in seconds.
COOL_OFF_FIRST_S: Final = 300.0
#: The longest cool-off (each failure past one doubles the next).
COOL_OFF_MAX_S: Final = 3600.0


class CoolOff:
    """The API's state across one proposer's proposals; ``clock`` gives epoch seconds."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._since: float | None = None
        self._class = ""
        self._until = 0.0
        self._next_s = COOL_OFF_FIRST_S

    def skip(self) -> str | None:
        """The fallback reason while the API is cooling off; ``None`` when it is to be asked."""
        if self._since is None or self.clock() >= self._until:
            return None
        return not_asked(_hhmm(self._since), self._class, _hhmm(self._until))

    def learn(self, fallback: str | None) -> None:
        """What a proposal that asked the API ended with (``None``: the model proposed)."""
        kind = None if fallback is None else fallback_class(fallback)
        if kind in API_FAULTS:
            now = self.clock()
            if self._since is None:
                self._since = now
            self._class = kind
            self._until = now + self._next_s
            self._next_s = min(2 * self._next_s, COOL_OFF_MAX_S)
        elif kind != SPEND_CAP:
            self._since, self._class, self._until = None, "", 0.0
            self._next_s = COOL_OFF_FIRST_S


def _hhmm(epoch: float) -> str:
    return f"{datetime.fromtimestamp(epoch, UTC):%H:%M} UTC"
