"""A profile's validation error in one line: where, what, how many more, and, for a key the
profile's schema does not have there, the key it is a typo of (``knobs.names``' policy). A
place under ``knobs:`` is named by its knob, as every other profile check names it
(``knobs.moe_backend.render.values.cutlass``, not ``knobs.0.render``)."""

from __future__ import annotations

import re
from typing import Any, get_args

from pydantic import BaseModel, ValidationError

from knobs.errors import KnobError
from knobs.names import did_you_mean
from knobs.space import KnobSpace
from knobs.spec import as_text

#: A knob's name as a profile's ``knobs:`` entry may give it (``knobs.spec.KnobSpec.name``).
_KNOB_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")


def first_error(e: ValidationError, model: type[BaseModel] | None = None, data: Any = None) -> str:
    """A validation error in one line: where, what, and how many more; a key ``model`` does
    not have there that is a typo of one it has names that one (``verdikt``: did you mean
    verdict?). ``data``: what was validated, whose ``knobs:`` entries name the place of an
    error under one by its knob's name (its index where the entry has no valid name)."""
    err = e.errors()[0]
    where = _where(err["loc"], data) or "(top level)"
    more = f" (and {e.error_count() - 1} more)" if e.error_count() > 1 else ""
    said = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden" and model is not None and err["loc"]:
        hint = did_you_mean(err["loc"][-1], _keys_at(model, err["loc"][:-1]))
        said = f"{said}; {hint}" if hint else said
    return f"{where}: {said}{more}"


def _where(loc: tuple[int | str, ...], data: Any) -> str:
    """``loc`` in words: ``knobs.0.render`` as ``knobs.moe_backend.render`` where ``data``'s
    first knobs entry is named moe_backend."""
    steps = [str(p) for p in loc]
    if len(loc) > 1 and loc[0] == "knobs" and isinstance(loc[1], int) and isinstance(data, dict):
        entries = data.get("knobs")
        if isinstance(entries, list | tuple) and 0 <= loc[1] < len(entries):
            entry = entries[loc[1]]
            name = entry.get("name") if isinstance(entry, dict) else None
            if isinstance(name, str) and _KNOB_NAME.match(name):
                steps[1] = name
    return ".".join(steps)


def _keys_at(model: type[BaseModel], loc: tuple[int | str, ...]) -> list[str]:
    """The keys ``model`` takes at ``loc`` (a list's index passed through, a union's model
    found): none where the path leads to no model."""
    at: object = model
    for step in loc:
        found = _model_in(at)
        if found is None:
            return []
        if isinstance(step, str):
            field = found.model_fields.get(step)
            if field is None:
                return []
            at = field.annotation
        else:
            at = found
    found = _model_in(at)
    return list(found.model_fields) if found is not None else []


def _model_in(annotation: object) -> type[BaseModel] | None:
    """The pydantic model an annotation holds (itself, or inside a list, an optional, a dict's
    values), if one."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in reversed(get_args(annotation)):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def starting_champion(e: KnobError, space: KnobSpace, champion: dict[str, Any]) -> str:
    """What ``champion:`` got wrong (``e``) and what to do, in one line. ``champion:`` is the
    starting config of a cluster the ledger has no champion for; one that has keeps its own,
    and a value outside a domain narrowed under it reaches the domain only by a change a
    verdict keeps (``evolution.outside_domain``): a value outside the domain says so, and the
    ways that do move it."""
    knob = e.knob
    if (
        knob is None
        or knob not in space.names
        or knob not in champion
        or _allowed(space, knob, champion[knob])
        or _misspelt(space, knob, champion[knob], e)
    ):
        return (
            f"champion: {e} (the starting config: give it a value the knob allows, or leave the "
            "knob out for its default; a ledger's champion keeps its own)"
        )
    default = as_text(space.spec(knob).default)
    return (
        f"champion: {e}: champion: starts only a cluster the ledger has no champion for: give "
        f"it a value the knob allows, or leave {knob} out (its default {default}); a cluster the "
        "ledger has a champion for keeps its value, measured, whatever champion: says, and its "
        f"rounds move {knob} into the domain only by a change a verdict keeps; to start inside "
        "the domain at once, run under a new ledger (ORCHESTRATE_LEDGER, ledger_url:) or "
        f"another cluster.name; to keep {as_text(champion[knob])} in reach, widen the domain again"
    )


def _misspelt(space: KnobSpace, knob: str, value: object, e: KnobError) -> bool:
    """Whether ``value`` is a typo rather than a value a narrowed domain left outside: no
    value of the knob's type at all (``7168x`` for an integer), or a near miss of a value the
    knob has (its error says ``did you mean``). The narrowed domain's advice (widen it, a new
    ledger) is for the second only."""
    if "did you mean" in str(e):
        return True
    kind = space.spec(knob).type
    if kind in ("int", "float") and not isinstance(value, bool):
        if isinstance(value, int | float):
            return False
        try:
            float(str(value).strip())
        except ValueError:
            return True
    return kind == "bool" and not isinstance(value, bool)


def _allowed(space: KnobSpace, knob: str, value: object) -> bool:
    try:
        space.spec(knob).parse(value)
    except KnobError:
        return False
    return True
