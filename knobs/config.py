"""``Config``: a full, hashable assignment of every knob; ``Change``: exactly one knob moved."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict

from knobs.spec import Value, as_text


class Config(Mapping[str, Value]):
    """An immutable mapping knob name → value. Equal configs hash equal, whatever the order.

    Build one through ``KnobSpace.config`` (which validates); the constructor trusts its input.
    """

    __slots__ = ("_items",)

    def __init__(self, values: Mapping[str, Value]) -> None:
        self._items: tuple[tuple[str, Value], ...] = tuple(sorted(values.items()))

    def __getitem__(self, key: str) -> Value:
        for name, value in self._items:
            if name == key:
                return value
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return (name for name, _ in self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(self.key)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Config):
            return self.key == other.key
        return NotImplemented

    def __repr__(self) -> str:
        return f"Config({self.to_json()})"

    @property
    def key(self) -> str:
        """A stable 16-hex digest of the canonical JSON: the config's identity in the ledger."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()[:16]

    def to_json(self) -> str:
        """Canonical JSON (sorted keys, no spaces)."""
        return json.dumps(dict(self._items), sort_keys=True, separators=(",", ":"))

    def as_dict(self) -> dict[str, Value]:
        """A plain dict copy."""
        return dict(self._items)

    def apply(self, change: Change) -> Config:
        """This config with ``change`` applied (the change is trusted to be validated)."""
        values = dict(self._items)
        values[change.knob] = change.new
        return Config(values)

    def diff(self, other: Config) -> list[str]:
        """Names of the knobs whose values differ between the two configs."""
        names = set(self) | set(other)
        return sorted(
            n
            for n in names
            if self.get(n) != other.get(n) or type(self.get(n)) is not type(other.get(n))
        )

    @classmethod
    def from_json(cls, text: str) -> Config:
        """A config from its canonical JSON (as stored in the ledger)."""
        data: dict[str, Any] = json.loads(text)
        return cls(data)


class Change(BaseModel):
    """Exactly one knob, from its champion value to a new one."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    knob: str
    old: Value
    new: Value

    def describe(self) -> str:
        """``knob old → new`` for tables and logs."""
        return f"{self.knob} {as_text(self.old)} → {as_text(self.new)}"
