"""What this release can read of a record a later release wrote.

A later release may add fields to a knob spec, a cell or a forbidden combination, and record
them in the ledger (a ``profile-revised`` event's detail). This release's models forbid fields
they do not know, so such a record would not validate at all. ``salvaged`` reads it with the
unknown fields left out, and says which they were; a record that still does not validate (a
type this release does not know, a field it needs that is missing) is not read.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import TypeVar

from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)


def salvaged(model: type[M], raw: object) -> tuple[M | None, list[str]]:
    """``raw`` as ``model``, and the fields left out to read it (dotted, ``render.shape``);
    ``(None, [])`` where it cannot be read even without them."""
    try:
        return model.model_validate(raw), []
    except ValidationError as e:
        errors = e.errors()
    if not isinstance(raw, dict) or any(err["type"] != "extra_forbidden" for err in errors):
        return None, []
    pruned = copy.deepcopy(raw)
    for err in errors:
        _drop(pruned, err["loc"])
    try:
        read = model.model_validate(pruned)
    except ValidationError:
        return None, []
    return read, [".".join(str(part) for part in err["loc"]) for err in errors]


def _drop(tree: object, loc: Sequence[int | str]) -> None:
    """``tree`` without the value at ``loc`` (a path of keys and indexes)."""
    *path, last = loc
    for part in path:
        inside = isinstance(tree, dict) and part in tree
        inside |= isinstance(tree, list) and isinstance(part, int) and part < len(tree)
        if not inside:
            return
        tree = tree[part]  # type: ignore[index]
    if isinstance(tree, dict):
        tree.pop(last, None)
