"""How long an LLM proposer leaves the API alone after it failed a whole proposal for the
infrastructure's reasons (``agents.llm_fallback.API_FAULTS``: timed out, unreachable,
unavailable, overloaded, a malformed response) or went on answering 429 (``rate limited``)
when the SDK's retries, or the proposal's deadline, ran out: the one home of that policy.

Without it, a dead gateway costs every proposal of the night its whole deadline again. After
such a failure the next proposals do not ask the API for a cool-off (``COOL_OFF_FIRST_S``,
doubled after each failure past a cool-off, at most ``COOL_OFF_MAX_S``; after a 429 at least
the ``retry-after`` it sent, within the same cap); the fallback proposes and its reason says
why, in the same class (so ``status`` and the report count it there). Past the cool-off the
API is asked again; an answer (a proposal, even a refused one) ends it. The model's own
refusals never start one; a spend cap neither starts nor ends one.

The cool-off outlives the process: the ledger keeps every proposal's fallback reason and when
it was recorded, so a resumed round, or the next night's, starts from the failures recorded
since the API last answered (``api_failures``, put in ``ProposalContext.api_failures`` by the
orchestrator), replayed as they happened (``CoolOff.resume``). Each counts from when its
proposal was recorded: a few seconds after the failure, the fallback's proposing time."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Final, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict

from agents.llm_fallback import (
    COOLING,
    RATE_LIMITED,
    SPEND_CAP,
    fallback_class,
    not_asked,
    retry_after_of,
    was_asked,
)
from knobs.records import LlmUsage

#: The first cool-off after an infrastructure failure, in seconds.
COOL_OFF_FIRST_S: Final = 300.0
#: The longest cool-off (each failure past one doubles the next).
COOL_OFF_MAX_S: Final = 3600.0


class ApiFailure(BaseModel):
    """A recorded proposal for which the API was asked and failed (a ``COOLING`` class)."""

    model_config = ConfigDict(frozen=True)

    #: when its proposal was recorded
    at: AwareDatetime
    #: its fallback reason, as the ledger keeps it
    fallback: str


def api_failures(recorded: Iterable[tuple[datetime, LlmUsage | None]]) -> tuple[ApiFailure, ...]:
    """The failures a cool-off resumes from: of the proposals ``recorded`` (oldest first, each
    with its LLM usage, ``None`` where no LLM was asked), those that asked the API and failed
    since the last one it answered."""
    failures: list[ApiFailure] = []
    for at, usage in recorded:
        if usage is None:
            continue
        effect = _effect(usage.fallback)
        if effect == "failed":
            assert usage.fallback is not None
            failures.append(ApiFailure(at=at, fallback=usage.fallback))
        elif effect == "answered":
            failures.clear()
    return tuple(failures)


class CoolOff:
    """The API's state across one proposer's proposals; ``clock`` gives epoch seconds."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._resumed = False
        self._since: float | None = None
        self._class = ""
        self._until = 0.0
        self._next_s = COOL_OFF_FIRST_S
        #: the 429's ``retry-after`` that set ``_until``, when it did
        self._asked_s: float | None = None

    def resume(self, failures: Iterable[ApiFailure]) -> None:
        """Once, before this process's first proposal: the state the failures recorded since
        the API last answered left (``api_failures``); later calls change nothing (the
        process learns the rest itself, ``learn``)."""
        if self._resumed:
            return
        self._resumed = True
        for failure in failures:
            self._learn(failure.fallback, failure.at.timestamp())

    def until(self) -> str | None:
        """When the API is asked again (``09:17 UTC``) while it cools off; ``None`` when it is
        to be asked now."""
        if self._since is None or self.clock() >= self._until:
            return None
        return _hhmm(self._until)

    def skip(self) -> str | None:
        """The fallback reason while the API is cooling off; ``None`` when it is to be asked."""
        again = self.until()
        if again is None or self._since is None:
            return None
        return not_asked(_hhmm(self._since), self._class, again, retry_after=self._asked_s)

    def learn(self, fallback: str | None) -> None:
        """What a proposal that asked the API ended with (``None``: the model proposed)."""
        self._learn(fallback, self.clock())

    def _learn(self, fallback: str | None, now: float) -> None:
        effect = _effect(fallback)
        if effect == "failed":
            assert fallback is not None
            if self._since is None:
                self._since = now
            self._class = fallback_class(fallback)
            asked = retry_after_of(fallback) if self._class == RATE_LIMITED else None
            wait = self._next_s if asked is None else min(max(asked, self._next_s), COOL_OFF_MAX_S)
            # said where the 429's wait set it (not where the cap cut it short)
            self._asked_s = asked if wait == asked else None
            self._until = now + wait
            self._next_s = min(2 * self._next_s, COOL_OFF_MAX_S)
        elif effect == "answered":
            self._since, self._class, self._until = None, "", 0.0
            self._next_s, self._asked_s = COOL_OFF_FIRST_S, None


def _effect(fallback: str | None) -> Literal["failed", "answered", "nothing"]:
    """What a proposal's end says of the API: ``failed`` (a ``COOLING`` class, the API asked),
    ``answered``, or ``nothing`` (a spend cap; a proposal made while it cooled off)."""
    if fallback is None:
        return "answered"
    if not was_asked(fallback):
        return "nothing"
    kind = fallback_class(fallback)
    if kind in COOLING:
        return "failed"
    return "nothing" if kind == SPEND_CAP else "answered"


def _hhmm(epoch: float) -> str:
    return f"{datetime.fromtimestamp(epoch, UTC):%H:%M} UTC"
