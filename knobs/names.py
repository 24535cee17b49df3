"""A name a person typed (a knob in ``--set``, a profile's ``knobs:`` or ``untuned:``) and the
known name it is a typo of: the one policy every "did you mean" follows."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

#: How alike (``difflib``'s ratio) a typed name and a known one may be before the typed one is
#: taken for a typo of the known: one letter off in twenty is 0.95.
TYPO_CUTOFF = 0.85


def did_you_mean(name: object, known: Iterable[str]) -> str | None:
    """``did you mean NAME?``, NAME the known name ``name`` is a typo of (``TYPO_CUTOFF``);
    ``None`` where it is none's."""
    if not isinstance(name, str):
        return None
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=TYPO_CUTOFF)
    return f"did you mean {close[0]}?" if close else None
