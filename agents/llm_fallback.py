"""Why an LLM proposer fell back, in a word, and a round's fallbacks counted: the one home of
that classification, for the round's line, ``status`` and the report.

It reads the proposals' notes as the ledger keeps them (``llm_fallback``: the reason
``agents.llm_conversation`` gave, in the words it always had), so a ledger of an older release
is counted the same way."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from agents.llm import clip

SPEND_CAP: Final = "spend cap"
RATE_LIMITED: Final = "rate limited"
#: The classes, in the order they are listed, each with the words of the reason that say it.
_CLASSES: Final = (
    # the SDK's retries ran out on a 429, or the deadline did while it waited as told
    (RATE_LIMITED, re.compile(r"\bHTTP 429\b")),
    # a gateway's fault (not JSON, an HTML page), not the model's; the second form is how
    # a release before it named one: "2 of 2 proposals refused (last: malformed response …"
    (
        "malformed response",
        re.compile(r"^Claude API sent a malformed response\b|\(last: malformed response from"),
    ),
    ("overloaded", re.compile(r"\bHTTP 529\b")),
    ("API unavailable", re.compile(r"^Claude API unavailable\b")),
    ("timed out", re.compile(r"^Claude API timed out\b")),
    ("unreachable", re.compile(r"^Claude API unreachable\b")),
    (SPEND_CAP, re.compile(r"^LLM spend cap reached\b")),
    ("refused", re.compile(r"^\d+ of \d+ proposals refused\b")),
)
#: The classes that are the API's or the way to it, never the model's.
API_FAULTS: Final = frozenset(
    {"malformed response", "overloaded", "API unavailable", "timed out", "unreachable"}
)
#: The classes after which an LLM proposer leaves the API alone for a while
#: (``agents.llm_cooloff``): its faults, and a 429 still answered when the SDK's retries (or
#: the proposal's deadline) ran out, which says when to come back (``retry-after``).
COOLING: Final = API_FAULTS | {RATE_LIMITED}
#: A proposal made while the API cools off: its class is the failure's that started it.
_NOT_ASKED: Final = re.compile(r"^Claude API not asked: failing since [^()]* \((?P<cls>[^()]+)\);")
#: How a reason says the wait a 429's ``retry-after`` asked for (``retry_after_words``).
_RETRY_AFTER: Final = re.compile(r"\bretry-after (?P<s>\d+(?:\.\d+)?)s\b")
#: A reason none of the classes says (a release's words this one does not know).
OTHER: Final = "other"
#: Longest reason the round's line quotes.
MAX_SAID = 200
_FALLBACK_FROM: Final = re.compile(r"^(?P<by>.+?) \(fallback from (?P<llm>[^()]+)\)$")


def fallback_class(reason: str) -> str:
    """``rate limited``, ``malformed response`` (from the API or a gateway), ``overloaded``,
    ``API unavailable``, ``timed out``, ``unreachable``, ``spend cap``, ``refused`` (the
    model's proposals were refused, or its replies had no tool call) or ``other``. A proposal
    the API was not asked for while it cooled off (``not_asked``) has the class of the failure
    that started the cool-off."""
    cooling = _NOT_ASKED.match(reason)
    if cooling is not None and cooling["cls"] in COOLING:
        return cooling["cls"]
    for name, pattern in _CLASSES:
        if pattern.search(reason):
            return name
    return OTHER


def not_asked(since: str, kind: str, again: str, *, retry_after: float | None = None) -> str:
    """The reason of a proposal made without asking the API, which has failed (``kind``, a
    ``COOLING`` class) since ``since`` and is asked again from ``again`` (as a 429's
    ``retry_after`` seconds asked, when they set it)."""
    said = f"Claude API not asked: failing since {since} ({kind}); asked again from {again}"
    return said if retry_after is None else f"{said}, as its {retry_after_words(retry_after)} asked"


def was_asked(reason: str) -> bool:
    """Whether the proposal whose fallback reason this is asked the API (``not_asked``: no)."""
    return _NOT_ASKED.match(reason) is None


def retry_after_words(seconds: float) -> str:
    """``retry-after 1800s``: the wait a 429 asked for, as a reason says it."""
    return f"retry-after {f'{seconds:.3f}'.rstrip('0').rstrip('.')}s"


def retry_after_of(reason: str) -> float | None:
    """The wait a reason says a 429 asked for (``retry_after_words``), if it says one."""
    said = _RETRY_AFTER.search(reason)
    return None if said is None else float(said["s"])


def fallback_line(source: str, notes: Mapping[str, str]) -> str | None:
    """The round's line for a proposal another proposer made because the LLM's failed
    (``claude fell back to optuna (rate limited): Claude API unavailable (HTTP 429 …) after 3
    attempts``); ``None`` for any other proposal."""
    reason = notes.get("llm_fallback")
    if reason is None:
        return None
    by, llm = _who(source)
    return f"{llm} fell back to {by} ({fallback_class(reason)}): {clip(reason, MAX_SAID)}"


def _who(source: str) -> tuple[str, str]:
    """The proposer that made it and the LLM proposer that fell back, from its source
    (``optuna (fallback from claude)``)."""
    match = _FALLBACK_FROM.match(source)
    return ("optuna", "the LLM") if match is None else (match["by"], match["llm"])


@dataclass
class Fallbacks:
    """A round's proposals an LLM proposer was asked for, and those it fell back on."""

    round_id: int | None = None
    asked: int = 0
    #: by class (``fallback_class``)
    by_class: Counter[str] = field(default_factory=Counter)
    #: the proposers that made them instead
    to: set[str] = field(default_factory=set)

    @classmethod
    def of(
        cls, proposals: Iterable[tuple[str, Mapping[str, str]]], *, round_id: int | None = None
    ) -> Fallbacks:
        """Counted from round ``round_id``'s proposals' sources and notes (an LLM was asked
        where the notes name its model: ``llm_model``)."""
        seen = cls(round_id=round_id)
        for source, notes in proposals:
            if "llm_model" not in notes:
                continue
            seen.asked += 1
            reason = notes.get("llm_fallback")
            if reason is not None:
                seen.by_class[fallback_class(reason)] += 1
                seen.to.add(_who(source)[0])
        return seen

    @property
    def fell_back(self) -> int:
        return sum(self.by_class.values())

    def words(self) -> str | None:
        """``2 of 6 proposals fell back to optuna: rate limited ×1, refused ×1`` (of those
        an LLM was asked for); ``None`` when no LLM was asked."""
        if not self.asked:
            return None
        if not self.fell_back:
            return f"none of {self.asked} proposals fell back: the LLM made each one"
        by = " or ".join(sorted(self.to))
        counted = ", ".join(f"{c} ×{n}" for c, n in sorted(self.by_class.items(), key=_order))
        return f"{self.fell_back} of {self.asked} proposals fell back to {by}: {counted}"

    def as_json(self) -> dict[str, Any]:
        return {
            "round": self.round_id,
            "asked": self.asked,
            "fell_back": self.fell_back,
            "by_class": dict(sorted(self.by_class.items(), key=_order)),
            "words": self.words(),
        }


def _order(item: tuple[str, int]) -> tuple[int, str]:
    """Most first, then by name."""
    return (-item[1], item[0])
