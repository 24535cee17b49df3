"""A name a person typed (a knob in ``--set``, a profile's ``knobs:`` or ``untuned:``) and the
known name it is a typo of: the one policy every "did you mean" follows."""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Sequence

#: How alike (``difflib``'s ratio) a typed name and a known one may be before the typed one is
#: taken for a typo of the known: one letter off in twenty is 0.95.
TYPO_CUTOFF = 0.85
#: The most known names a "did you mean" offers.
AT_MOST = 3
_NUMBER = re.compile(r"(?=.*[0-9])[+-]?[0-9._eE+-]+")


def close_names(name: object, known: Iterable[str]) -> list[str]:
    """The known names ``name`` is taken for a typo of, the closest first: one alike to
    ``TYPO_CUTOFF``, one a single edit away (a letter wrong, missing or extra, or two letters
    swapped: a short word's ratio drops below the cutoff at one slip, ``aks`` for ``ask``), and
    one that begins with it (``fp8`` of ``fp8_e4m3`` and ``fp8_e5m2``); a number by the ratio
    alone (``6`` is no typo of ``16``); at most ``AT_MOST``, none where ``name`` is known."""
    names = list(dict.fromkeys(known))
    if not isinstance(name, str) or not name or name in names:
        return []
    close = difflib.get_close_matches(name, names, n=AT_MOST, cutoff=TYPO_CUTOFF)
    if _NUMBER.fullmatch(name):  # a number one digit off another is another number, no typo
        return close
    close += [k for k in names if _one_edit(name, k) and k not in close]
    if len(name) >= 2:
        close += [k for k in names if k.startswith(name) and k not in close]
    return close[:AT_MOST]


def did_you_mean(name: object, known: Iterable[str]) -> str | None:
    """``did you mean NAME?`` (``A or B?`` where several are as close), the known names
    ``name`` is a typo of (``close_names``); ``None`` where it is none's."""
    close = close_names(name, known)
    if not close:
        return None
    said = close[0] if len(close) == 1 else f"{', '.join(close[:-1])} or {close[-1]}"
    return f"did you mean {said}?"


def _one_edit(typed: str, known: str) -> bool:
    """Whether ``typed`` is ``known`` with one letter changed, dropped or added, or two
    neighbouring letters swapped."""
    if typed == known or abs(len(typed) - len(known)) > 1:
        return False
    if len(typed) == len(known):
        wrong = [i for i, (a, b) in enumerate(zip(typed, known, strict=True)) if a != b]
        if len(wrong) == 1:
            return True
        i = wrong[0]
        return wrong == [i, i + 1] and typed[i] == known[i + 1] and typed[i + 1] == known[i]
    short, long = sorted((typed, known), key=len)
    return any(long[:i] + long[i + 1 :] == short for i in range(len(long)))


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
