"""A name a person typed (a knob in ``--set``, a profile's ``knobs:`` or ``untuned:``) and the
known name it is a typo of: the one policy every "did you mean" follows."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence

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


def rename_clash(
    noun: str, renames: Sequence[tuple[str, str | None]], record: tuple[str, str]
) -> str | None:
    """A ``renamed_from`` (a knob's, a cell's) naming a name still here (its own or another's),
    or two renamed from one, in words; else None. ``renames``: each one's name and what it says
    it was; ``record``: what carries over, as it calls a name and as it carries over (``("
    readings call", "readings carry")``)."""
    names = {name for name, _ in renames}
    seen: dict[str, str] = {}
    for name, was in renames:
        if was is None:
            continue
        if was in names:
            what = "its own name" if was == name else f"the name of {noun} {was}, still here"
            return (
                f"{noun} {name}: renamed_from: {was} is {what}; renamed_from names the {noun} "
                f"as the ledger's {record[0]} it before the rename"
            )
        if was in seen:
            return (
                f"{noun}s {seen[was]} and {name} are both renamed_from: {was}; one {noun}'s "
                f"{record[1]} over to one {noun}"
            )
        seen[was] = name
    return None
