"""``Config``: a full, hashable assignment of every knob; ``Change``: exactly one knob moved
(or, for a coupled move, one knob and the one change that lets its value boot)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator

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
        for move in change.moves():
            values[move.knob] = move.new
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
    """Exactly one knob, from its champion value to a new one.

    A coupled move (``agents.coupled``) carries a second knob in ``enabling``: the value of
    ``knob`` failed to boot for a reason that knob explains (``kv_cache_dtype=auto`` short of
    KV-cache memory at ``gpu_memory_utilization`` 0.85), so both move in one experiment
    (``kv_cache_dtype fp8_e4m3 → auto + gpu_memory_utilization 0.85 → 0.86``). ``knob`` is
    the knob whose value failed; every other change has ``enabling`` None.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    knob: str
    old: Value
    new: Value
    #: The enabling change of a coupled move (a one-knob change of another knob), else None.
    enabling: Change | None = None

    @model_validator(mode="after")
    def _one_enabling_change(self) -> Change:
        if self.enabling is not None:
            if self.enabling.enabling is not None:
                raise ValueError("a coupled move couples two knobs, not more")
            if self.enabling.knob == self.knob:
                raise ValueError(f"a coupled move needs two knobs, not {self.knob} twice")
        return self

    @property
    def coupled(self) -> bool:
        """Whether this is a coupled move (two knobs in one experiment)."""
        return self.enabling is not None

    @property
    def label(self) -> str:
        """The knob column of results.tsv: ``knob``, or ``knob+enabling knob`` when coupled."""
        return self.knob if self.enabling is None else f"{self.knob}+{self.enabling.knob}"

    def moves(self) -> tuple[Change, ...]:
        """The one-knob changes this change makes: itself, or its two halves when coupled."""
        if self.enabling is None:
            return (self,)
        return (self.model_copy(update={"enabling": None}), self.enabling)

    def describe(self) -> str:
        """``knob old → new`` for tables and logs (``… + knob old → new`` when coupled)."""
        one = f"{self.knob} {as_text(self.old)} → {as_text(self.new)}"
        return one if self.enabling is None else f"{one} + {self.enabling.describe()}"
