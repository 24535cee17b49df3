"""A profile's knob space: its knobs, the hard constraints between them, and validation."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from pydantic import BaseModel, ConfigDict, Field, model_validator

from knobs.config import Change, Config
from knobs.errors import KnobError
from knobs.names import did_you_mean, rename_clash
from knobs.spec import KnobSpec, Value, as_text, printable


class ForbiddenCombination(BaseModel):
    """A hard constraint: configurations matching every ``when`` entry are never run."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    when: dict[str, Value] = Field(min_length=1)
    reason: str

    def matches(self, config: Mapping[str, Value]) -> bool:
        """Whether ``config`` falls inside this forbidden region."""
        return all(k in config and config[k] == v for k, v in self.when.items())

    def describe(self) -> str:
        """The rule in words: ``k=v, k2=v2: its reason``."""
        what = ", ".join(f"{k}={as_text(v)}" for k, v in self.when.items())
        return f"{what}: {self.reason}"


class RenderedKnobs(BaseModel):
    """A config as launcher pieces: extra argv tokens, JSON-flag fields, environment."""

    model_config = ConfigDict(frozen=True)

    argv: tuple[str, ...]
    json_fields: dict[str, dict[str, Value]]
    env: dict[str, str]


class Reconciled(NamedTuple):
    """A recorded config fitted to the current space, and what fitting it changed."""

    #: Every knob of the space: the recorded values, the base's (else defaults) for the knobs
    #: added since.
    config: Config
    #: Knobs of the space the recorded config lacked (each took the base's value, else its
    #: default), space order.
    added: list[str]
    #: Knobs the recorded config had and the space no longer has (dropped), sorted.
    removed: list[str]


class KnobSpace(BaseModel):
    """The knobs a profile exposes and the constraints between them."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    knobs: tuple[KnobSpec, ...] = Field(min_length=1)
    forbidden: tuple[ForbiddenCombination, ...] = ()

    @model_validator(mode="after")
    def _consistent(self) -> KnobSpace:
        names = [k.name for k in self.knobs]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"knob names appear twice: {', '.join(dupes)}")
        clash = render_clash(self.knobs)
        if clash is not None:
            raise ValueError(clash)
        renamed = renamed_clash(self.knobs)
        if renamed is not None:
            raise ValueError(renamed)
        # each value as the knob's own (a quoted `"true"`, `"0.86"`): kept as written, a rule
        # compared text with the config's typed value and never matched
        typed = tuple(
            rule.model_copy(
                update={"when": {k: self.spec(k).parse(v) for k, v in rule.when.items()}}
            )
            for rule in self.forbidden
        )
        if typed != self.forbidden:
            object.__setattr__(self, "forbidden", typed)
        return self

    @property
    def names(self) -> list[str]:
        """Knob names in declaration order."""
        return [k.name for k in self.knobs]

    @property
    def renames(self) -> dict[str, str]:
        """Each knob renamed (``renamed_from``): its old name to its name now."""
        return {k.renamed_from: k.name for k in self.knobs if k.renamed_from is not None}

    def spec(self, name: object) -> KnobSpec:
        """The spec of knob ``name``.

        Raises:
            KnobError: no knob of that name in this space.
        """
        for knob in self.knobs:
            if knob.name == name:
                return knob
        known = ", ".join(self.names)
        hint = did_you_mean(name, self.names)
        raise KnobError(
            f"unknown knob {printable(name)}; "
            + (f"known knobs: {known}" if hint is None else f"{hint} (known knobs: {known})"),
            knob=None,
            value=name,
        )

    def default_config(self) -> Config:
        """Every knob at its default."""
        return self.config({k.name: k.default for k in self.knobs})

    def config(self, values: Mapping[str, object], *, partial: bool = False) -> Config:
        """A validated full config from untrusted ``values``.

        With ``partial`` the missing knobs take their defaults.

        Raises:
            KnobError: unknown knob, missing knob, bad value, or a forbidden combination.
        """
        typed: dict[str, Value] = {}
        for name, raw in values.items():
            typed[name] = self.spec(name).parse(raw)
        missing = [k.name for k in self.knobs if k.name not in typed]
        if missing and not partial:
            raise KnobError(f"config lacks knobs: {', '.join(missing)}")
        for knob in self.knobs:
            typed.setdefault(knob.name, knob.default)
        config = Config(typed)
        self.check_constraints(config)
        return config

    def reconcile(
        self, recorded: Mapping[str, Value], base: Mapping[str, Value] | None = None
    ) -> Reconciled:
        """A config recorded under an earlier profile, as this space sees it.

        A knob of the space that ``recorded`` lacks takes its value in ``base`` (a change's: the
        config it moved one knob of, as this space sees it), else its default (the profile
        gained it); a knob ``recorded`` has and the space lacks is dropped (the profile lost
        it). The values of the knobs both have are kept as recorded (they are what ran), and a
        config that fits is returned unchanged, with the same key. Never raises.
        """
        # a knob renamed (``renamed_from``) is the old name's value: neither lost nor gained
        recorded = self.renamed(recorded)
        values = {k: v for k, v in recorded.items() if k in self.names}
        added = [k.name for k in self.knobs if k.name not in recorded]
        for name in added:
            values[name] = (
                base[name] if base is not None and name in base else self.spec(name).default
            )
        removed = sorted(k for k in recorded if k not in values)
        return Reconciled(config=Config(values), added=added, removed=removed)

    def renamed(self, recorded: Mapping[str, Value]) -> dict[str, Value]:
        """``recorded`` (a config of the ledger's) with each knob renamed since under its name
        now; one that has the name now already keeps its own value."""
        renames = self.renames
        if not renames:
            return dict(recorded)
        out: dict[str, Value] = {}
        for name, value in recorded.items():
            now = renames.get(name)
            if now is None:
                out[name] = value
            elif now not in recorded:
                out[now] = value
        return out

    def current_name(self, name: str) -> str:
        """The name now of a knob the ledger's history names ``name`` (renamed since, or not)."""
        return self.renames.get(name, name)

    def check_constraints(self, config: Config) -> None:
        """Raises:
        KnobError: the config matches a forbidden combination (the error names it).
        """
        for rule in self.forbidden:
            if rule.matches(config):
                raise KnobError(f"forbidden combination {rule.describe()}")

    def change(self, champion: Config, knob: object, raw: object) -> Change:
        """A validated one-knob ``Change`` away from ``champion``.

        Raises:
            KnobError: unknown knob, bad value, no change at all, or a forbidden result.
        """
        spec = self.spec(knob)
        value = spec.parse(raw)
        old = champion[spec.name]
        if value == old and type(value) is type(old):
            raise KnobError(
                f"knob {spec.name}: {as_text(value)} is already the champion's value",
                knob=spec.name,
                value=raw,
            )
        change = Change(knob=spec.name, old=old, new=value)
        self.check_constraints(champion.apply(change))
        return change

    def coupled_change(
        self, champion: Config, knob: object, raw: object, enabling: object, enabling_raw: object
    ) -> Change:
        """A validated coupled move away from ``champion``: ``knob`` to ``raw`` together with
        ``enabling`` to ``enabling_raw`` (``Change.enabling``). Whether the move may run is
        ``agents.coupled``'s question; this checks only that it is two real changes of two
        knobs whose result breaks no hard constraint.

        Raises:
            KnobError: unknown knob, bad value, no change, the same knob twice, or a forbidden
                result.
        """
        first = self.change(champion, knob, raw)
        second = self.change(champion, enabling, enabling_raw)
        if first.knob == second.knob:
            raise KnobError(
                f"a coupled move needs two knobs, not {first.knob} twice", knob=first.knob
            )
        change = first.model_copy(update={"enabling": second})
        self.check_constraints(champion.apply(change))
        return change

    def neighbours(self, champion: Config) -> list[Change]:
        """Every allowed one-knob change away from ``champion``, knob by knob, value by value."""
        out: list[Change] = []
        for knob in self.knobs:
            for value in knob.domain():
                if value == champion[knob.name]:
                    continue
                change = Change(knob=knob.name, old=champion[knob.name], new=value)
                if not any(rule.matches(champion.apply(change)) for rule in self.forbidden):
                    out.append(change)
        return out

    def render(self, config: Config) -> RenderedKnobs:
        """The launcher pieces of ``config``: flags, JSON-flag fields, environment."""
        argv: list[str] = []
        fields: dict[str, dict[str, Value]] = {}
        env: dict[str, str] = {}
        for knob in self.knobs:
            piece = render_knob(knob, config[knob.name])
            argv += piece.argv
            for flag, values in piece.json_fields.items():
                fields.setdefault(flag, {}).update(values)
            env.update(piece.env)
        return RenderedKnobs(argv=tuple(argv), json_fields=fields, env=env)


def render_knob(knob: KnobSpec, value: Value) -> RenderedKnobs:
    """The launcher pieces of one knob at ``value``."""
    shown = knob.rendered(value)
    how = knob.render
    if how.kind == "flag":
        assert how.flag is not None
        return RenderedKnobs(argv=(how.flag, as_text(shown)), json_fields={}, env={})
    if how.kind == "switch":
        tokens = how.when_true if value else how.when_false
        env = how.env_when_true if value else how.env_when_false
        return RenderedKnobs(argv=tokens, json_fields={}, env=dict(env))
    if how.kind == "json_field":
        assert how.flag is not None and how.field is not None
        return RenderedKnobs(argv=(), json_fields={how.flag: {how.field: shown}}, env={})
    assert how.env is not None
    return RenderedKnobs(argv=(), json_fields={}, env={how.env: as_text(shown)})


def render_clash(knobs: Sequence[KnobSpec]) -> str | None:
    """Two knobs that write the same flag, JSON field or environment variable (the later one
    would silently win, and changes of the other would deploy nothing), in words; else None."""
    writes: dict[str, str] = {}
    json_flags = {k.render.flag for k in knobs if k.render.kind == "json_field"}
    for knob in knobs:
        how = knob.render
        if how.kind == "flag" and how.flag in json_flags:
            return f"knob {knob.name} renders {how.flag}, which other knobs fill as JSON"
        # a switch's flags count as a flag knob's do: two knobs both adding --enforce-eager
        # deploy nothing for one's change whenever the other holds the token
        switched = {t.split("=")[0] for t in (*how.when_true, *how.when_false) if t[:1] == "-"}
        targets = {
            "flag": [str(how.flag)],
            "json_field": [f"{how.flag} field {how.field}"],
            "env": [f"${how.env}"],
            "switch": [
                *sorted(switched),
                *(f"${name}" for name in {**how.env_when_true, **how.env_when_false}),
            ],
        }[how.kind]
        for target in targets:
            other = writes.setdefault(target, knob.name)
            if other != knob.name:
                return f"knobs {other} and {knob.name} both render {target}"
    return None


def renamed_clash(knobs: Sequence[KnobSpec]) -> str | None:
    """A ``renamed_from`` naming a knob still here (its own name or another's), or two knobs
    renamed from one, in words; else None."""
    said = rename_clash(
        "knob", [(k.name, k.renamed_from) for k in knobs], ("history calls", "history carries")
    )
    if said is not None:
        return said
    for knob in knobs:
        if knob.new and knob.renamed_from is not None:
            return (
                f"knob {knob.name} says both new: true and renamed_from: {knob.renamed_from}; a "
                "knob renamed has a past: take one out"
            )
    return None


def merge_json_flag(base: Mapping[str, Value], fields: Mapping[str, Value]) -> str:
    """The JSON text of a flag like ``--speculative-config``: ``base`` overlaid with knob fields."""
    merged = {**base, **fields}
    return json.dumps(merged, separators=(",", ":"))


def overlay(knobs: Sequence[KnobSpec], overrides: Sequence[KnobSpec]) -> tuple[KnobSpec, ...]:
    """``knobs`` with same-named specs replaced by ``overrides`` and new ones appended."""
    by_name = {k.name: k for k in overrides}
    out = [by_name.pop(k.name, k) for k in knobs]
    return (*out, *by_name.values())
