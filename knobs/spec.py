"""Knob specs: a name, a type, a finite domain, a default, and how the value reaches a launcher."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from knobs.errors import KnobError
from knobs.names import did_you_mean
from knobs.vocabulary import FAILURE_CLASSES, INFRASTRUCTURE, GuardrailRule

#: A knob's value. Every domain is finite, so every value can be listed and compared.
Value = bool | int | float | str

#: Strings that may ever be a knob value or a rendered token ({name} is a launcher placeholder,
#: filled from validated node fields). Nothing here can open a shell
#: construct, even before ``shlex.quote`` is applied on the way to a remote command.
SAFE_TOKEN = re.compile(r"^[A-Za-z0-9_.:/+=@,%{}-]{1,256}$")
_INT = re.compile(r"^[+-]?\d{1,12}$")
_FLOAT = re.compile(r"^[+-]?(\d{1,12}(\.\d{0,12})?|\.\d{1,12})([eE][+-]?\d{1,3})?$")
_TRUE = {"true", "on", "yes", "1"}
_FALSE = {"false", "off", "no", "0"}


def clipped(text: str, limit: int) -> str:
    """``text`` in at most ``limit`` characters for a line a person reads: whole if it fits,
    else cut at the last word boundary that keeps at least half of it (mid-word only where one
    word is longer) and ended with an ellipsis, so a cut never reads as the end of the text."""
    if len(text) <= limit:
        return text
    cut = text[: limit - 1]
    space = cut.rfind(" ")
    if space >= limit // 2:
        cut = cut[:space]
    return cut.rstrip(" ,;:.-") + "…"


def printable(raw: object, limit: int = 60) -> str:
    """``raw`` as a short, single-line string safe to put in a line a person reads: a boolean
    and nothing as a profile (YAML, JSON) spells them (``true``, ``false``, ``null``), never
    Python's ``False``; anything else repr-quoted (a string quoted, so ``'5'`` is not 5)."""
    text = "null" if raw is None else str(raw).lower() if isinstance(raw, bool) else repr(raw)
    return clipped(text, limit)


def _launchable(mapped: Value) -> Value:
    """A ``render.values`` entry a launcher can take; checked as one entry, so that a bad one
    is placed at its own key (``render.values.cutlass``), not at the knob's whole rendering."""
    if isinstance(mapped, str) and not SAFE_TOKEN.match(mapped):
        raise ValueError(f"rendered value {mapped!r} has characters a launcher cannot take")
    return mapped


class RenderSpec(BaseModel):
    """How a knob's value reaches the engine's command line or environment.

    - ``flag``: ``FLAG VALUE`` (``--max-num-batched-tokens 7168``).
    - ``switch``: a boolean that adds ``when_true`` or ``when_false`` tokens
      (``cuda_graphs=false`` adds ``--enforce-eager``), and/or sets the variables of
      ``env_when_true`` or ``env_when_false`` (``cuda_graphs=false`` sets
      ``GGML_CUDA_DISABLE_GRAPHS=1`` for llama.cpp, which reads any value, even ``0``, as
      "disable": the variable must be absent, not false, for the other side).
    - ``json_field``: ``FIELD`` inside the JSON object of flag ``FLAG``
      (``num_speculative_tokens`` inside ``--speculative-config``).
    - ``env``: an environment variable ``ENV=VALUE``.
    ``values`` maps a knob value (as its string) to what is rendered instead, e.g. an adapter
    rank to the drafter directory it selects; a value it does not list renders as itself.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["flag", "switch", "json_field", "env"]
    flag: str | None = None
    field: str | None = None
    env: str | None = None
    when_true: tuple[str, ...] = ()
    when_false: tuple[str, ...] = ()
    env_when_true: dict[str, str] = Field(default_factory=dict)
    env_when_false: dict[str, str] = Field(default_factory=dict)
    values: dict[str, Annotated[Value, AfterValidator(_launchable)]] | None = None

    @model_validator(mode="after")
    def _complete(self) -> RenderSpec:
        need = {"flag": ("flag",), "json_field": ("flag", "field"), "env": ("env",), "switch": ()}
        for attr in need[self.kind]:
            if not getattr(self, attr):
                raise ValueError(f"render kind {self.kind!r} needs {attr!r}")
        for token in (*self.when_true, *self.when_false, self.flag or "x", self.field or "x"):
            if not SAFE_TOKEN.match(token):
                raise ValueError(f"render token {token!r} has characters a launcher cannot take")
        if self.env and not re.match(r"^[A-Z_][A-Z0-9_]{0,127}$", self.env):
            raise ValueError(f"env name {self.env!r} is not an environment variable name")
        switched = {**self.env_when_true, **self.env_when_false}
        if switched and self.kind != "switch":
            raise ValueError("env_when_true/env_when_false belong to render kind 'switch'")
        for name, value in switched.items():
            if not re.match(r"^[A-Z_][A-Z0-9_]{0,127}$", name):
                raise ValueError(f"env name {name!r} is not an environment variable name")
            if not SAFE_TOKEN.match(value):
                raise ValueError(f"env value {value!r} has characters a launcher cannot take")
        return self


class EffectPrior(BaseModel):
    """What is known, before measuring, about what changing a knob does to the objective.

    A share ``p_null`` of its changes do nothing; the rest move the objective by a relative
    amount spread ``effect_pct`` (a normal on the log scale, either sign). The verdict judges a
    one-knob change with its knob's prior when the knob declares one, else with the profile's
    (``verdict.prior_null`` / ``verdict.prior_effect_pct``). ``source`` says where the belief
    comes from, so that a reader can check it.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    p_null: float = Field(ge=0, lt=1, description="share of this knob's changes that do nothing")
    effect_pct: float = Field(gt=0, le=100, description="spread of the effect when there is one")
    source: str = ""


#: The failure classes a boot may fail of on the config's account, which a knob may declare
#: monotone (``KnobSpec.monotone_failures``); the others are the infrastructure's.
CONFIG_FAILURES: tuple[str, ...] = tuple(c for c in FAILURE_CLASSES if c not in INFRASTRUCTURE)


class KnobSpec(BaseModel):
    """One tunable setting of a serving stack, with a finite, validated domain."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=r"^[a-z][a-z0-9_]{0,63}$")
    type: Literal["int", "float", "bool", "choice"]
    default: Value
    low: float | None = None
    high: float | None = None
    step: float | None = None
    choices: tuple[Value, ...] | None = None
    description: str = ""
    render: RenderSpec
    #: Boot failures that are monotone in this knob: ``{failure class: side}``. A failure of
    #: that class at value v means the values on that side of v fail alike (``above``: v and
    #: every larger value, e.g. ``oom`` on a memory fraction; ``below``: v and every smaller
    #: one, e.g. ``kv_capacity``), so one crash bars the whole side for every proposer instead
    #: of costing a boot per value. Numeric knobs only.
    monotone_failures: dict[str, Literal["above", "below"]] = Field(default_factory=dict)
    #: Guardrails that are monotone in this knob: ``{verdict rule: side}``. A change to value v
    #: discarded by that guardrail (``GUARDRAIL_RULES``) means the values on that side of v break
    #: it alike with the other knobs as they were (``below``: v and every smaller value, e.g.
    #: ``ttft-guardrail`` on MNBT, whose smaller prefill chunks take a long prompt more steps),
    #: so the discard bars that side under those other values instead of costing a boot per
    #: value, while the champion it was measured against stays (any keep lifts it). Numeric
    #: knobs only.
    monotone_guardrails: dict[GuardrailRule, Literal["above", "below"]] = Field(
        default_factory=dict
    )
    #: What changing this knob is known to do, for the verdict's prior (None: the profile's).
    effect_prior: EffectPrior | None = None
    #: What the knob is to the models that know it: ``draft_tokens``, the draft length K of
    #: speculative decoding, whose effect the proposer predicts from the champion's
    #: per-position acceptance before booting (``agents.draft_model``). A count: an int knob
    #: from 0 up, or choices that are all such ints.
    role: Literal["draft_tokens"] | None = None
    #: Knobs whose best value may move when this one changes (or the other way round): K's
    #: best value moves with the verify step's cost (CUDA graphs) and with the drafter's
    #: acceptance (its adapter). After a keep of either, the proposer looks at the other
    #: again under the new champion. Symmetric: declaring it on one side is enough.
    interacts_with: tuple[str, ...] = ()
    #: The name the ledger's history knows it by (``renamed_from: chunk`` on ``mnbt``): the
    #: champion's value and every experiment recorded under the old name are read as this
    #: knob's (``KnobSpace.reconcile``, ``orchestrator.knob_renames``); nothing recorded is
    #: rewritten. Not part of what the knob renders, so never dumped: not in a profile's
    #: digest nor its revision.
    renamed_from: str | None = Field(default=None, pattern=r"^[a-z][a-z0-9_]{0,63}$", exclude=True)
    #: A knob with no past (``new: true``): neither a typo of a catalog knob's name nor a knob
    #: the profile dropped renamed (``orchestrator.knob_renames``). Never dumped.
    new: bool = Field(default=False, exclude=True)

    @model_validator(mode="after")
    def _domain(self) -> KnobSpec:
        if self.type in ("int", "float"):
            if self.low is None or self.high is None or self.low > self.high:
                raise ValueError(f"knob {self.name}: an {self.type} knob needs low <= high")
            if self.type == "float" and not self.step:
                raise ValueError(
                    f"knob {self.name}: a float knob needs a step (domains are finite)"
                )
            if self.step is not None and self.step <= 0:
                raise ValueError(f"knob {self.name}: step must be positive")
        if self.type == "choice":
            if not self.choices:
                raise ValueError(f"knob {self.name}: a choice knob needs choices")
            seen: dict[str, Value] = {}
            for choice in self.choices:
                if isinstance(choice, str) and not SAFE_TOKEN.match(choice):
                    raise ValueError(f"knob {self.name}: choice {choice!r} is not a safe token")
                # two choices the launcher gets alike (1.0 and 1, 1 and "1"): a change between
                # them deploys nothing, and boots would be spent on a verdict about nothing
                twin = seen.setdefault(_key(choice), choice)
                if twin is not choice:
                    raise ValueError(
                        f"knob {self.name}: choices {twin!r} and {choice!r} are the same value "
                        f"to the engine ({_key(choice)}): keep one of them"
                    )
        if self.type == "bool" and self.render.kind not in ("switch", "env", "json_field", "flag"):
            raise ValueError(f"knob {self.name}: cannot render a bool as {self.render.kind}")
        if self.monotone_failures and not self.ordered:
            raise ValueError(
                f"knob {self.name}: monotone_failures needs a numeric knob (int, float, or "
                "choices that are all numbers)"
            )
        if self.monotone_guardrails and not self.ordered:
            raise ValueError(
                f"knob {self.name}: monotone_guardrails needs a numeric knob (int, float, or "
                "choices that are all numbers)"
            )
        for failure in self.monotone_failures:
            if failure in INFRASTRUCTURE:
                raise ValueError(
                    f"knob {self.name}: monotone_failures: {failure} is the infrastructure's, "
                    "never a value's, and bars nothing; name a config's failure class ("
                    + ", ".join(CONFIG_FAILURES)
                    + ")"
                )
            if failure not in FAILURE_CLASSES:
                raise ValueError(
                    f"knob {self.name}: monotone_failures: {failure!r} is not a failure class; "
                    "known for a config: " + ", ".join(CONFIG_FAILURES)
                )
        if self.role == "draft_tokens" and not self._counts():
            raise ValueError(
                f"knob {self.name}: role draft_tokens needs a count of draft tokens (an int "
                "knob with low >= 0, or choices that are all such ints)"
            )
        # the default must itself be in the domain; one written as text (YAML's quoted
        # `default: "false"`, `"7168"`) is kept as the value it names, never as the text, which
        # a switch would read as true and a config would hash apart from the typed value
        try:
            typed = self.parse(self.default)
        except KnobError as e:
            raise KnobError(
                f"knobs.{self.name}.default: {e.message.removeprefix(f'knob {self.name}: ')}"
                f"{self._off_step(self.default)}",
                knob=self.name,
                value=e.value,
            ) from e
        if isinstance(self.default, str) and typed != self.default:
            object.__setattr__(self, "default", typed)
        self._key_values()
        return self

    def _key_values(self) -> None:
        """``render.values`` keyed as ``rendered`` looks values up: each key read as a value
        of the domain (``"1.00"`` is 1.0's, rendered as ``1``), so that no entry is silently
        passed over, the raw value deploying instead of the path it maps to. A key a typo away
        from a value (``autoo``) is refused; one of no value of the domain is kept as it is,
        looked up by nothing (a catalog's map under a domain a profile narrowed)."""
        if not self.render.values:
            return
        keyed: dict[str, Value] = {}
        for key, shown in self.render.values.items():
            try:
                value = self.parse(key)
            except KnobError:
                typo = did_you_mean(key, [_key(v) for v in self.domain()])
                if typo is not None:
                    raise ValueError(
                        f"render.values key {key!r} is not {self.describe_domain()}; {typo}"
                    ) from None
                keyed[key] = shown
                continue
            if _key(value) in keyed:
                raise ValueError(f"render.values names {as_text(value)} of knob {self.name} twice")
            keyed[_key(value)] = shown
        if keyed != self.render.values:
            object.__setattr__(self, "render", self.render.model_copy(update={"values": keyed}))

    def _counts(self) -> bool:
        """Every value is a count: an int knob from 0 up, or choices that are all such ints."""
        if self.type == "int":
            return (self.low or 0) >= 0
        return self.type == "choice" and all(
            isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in self.choices or ()
        )

    # ---- the domain -------------------------------------------------------------------------
    @property
    def ordered(self) -> bool:
        """Whether the values are numbers in a meaningful order (int, float, numeric choices)."""
        if self.type in ("int", "float"):
            return True
        return self.type == "choice" and all(
            isinstance(c, int | float) and not isinstance(c, bool) for c in self.choices or ()
        )

    def domain(self) -> list[Value]:
        """Every value of the domain, in order."""
        if self.type == "bool":
            return [False, True]
        if self.type == "choice":
            assert self.choices is not None
            return list(self.choices)
        assert self.low is not None and self.high is not None
        step = self.step or 1
        count = math.floor((self.high - self.low) / step + 1e-9) + 1
        if self.type == "int":
            return [int(self.low + i * step) for i in range(count)]
        return [self._round(self.low + i * step) for i in range(count)]

    def _round(self, value: float) -> float:
        digits = max(0, -math.floor(math.log10(self.step))) + 2 if self.step else 6
        return round(value, digits)

    def describe_domain(self) -> str:
        """The domain in words, for error messages and the proposer's context."""
        if self.type == "bool":
            return "true or false"
        if self.type == "choice":
            assert self.choices is not None
            return "one of " + ", ".join(str(c) for c in self.choices)
        step = f" in steps of {self.step:g}" if self.step and self.step != 1 else ""
        kind = "an integer" if self.type == "int" else "a number"
        return f"{kind} from {self.low:g} to {self.high:g}{step}"

    # ---- validation of untrusted values -----------------------------------------------------
    def parse(self, raw: object) -> Value:
        """``raw`` (from a profile, a person, an LLM) as a typed value of this knob's domain.

        Raises:
            KnobError: wrong type, not a value of the domain, or characters that are not allowed.
        """
        where = f"knob {self.name}"
        bad = KnobError(
            f"{where}: {printable(raw)} is not {self.describe_domain()}", knob=self.name, value=raw
        )
        if self.type == "bool":
            if isinstance(raw, bool):
                return raw
            if isinstance(raw, str) and raw.strip().lower() in _TRUE | _FALSE:
                return raw.strip().lower() in _TRUE
            raise self._typo(bad, raw, ("true", "false"))
        if self.type == "int":
            value = self._as_number(raw, integer=True, bad=bad)
            return self._in_range(int(value), bad)
        if self.type == "float":
            value = self._as_number(raw, integer=False, bad=bad)
            return self._in_range(value, bad)
        assert self.choices is not None
        for choice in self.choices:
            if type(raw) is type(choice) and raw == choice:
                return choice
            if isinstance(raw, str) and not isinstance(choice, str) and raw.strip() == str(choice):
                return choice
            if isinstance(choice, str) and isinstance(raw, str) and raw.strip() == choice:
                return choice
            numeric = isinstance(raw, int) and not isinstance(raw, bool)
            if isinstance(choice, float) and numeric and float(raw) == choice:  # type: ignore[arg-type]
                return choice
        if isinstance(raw, str) and _FLOAT.match(raw.strip()):
            # a number spelt otherwise ("1.00", "64.0") names the numeric choice it equals
            number = float(raw.strip())
            for choice in self.choices:
                numeric_choice = isinstance(choice, int | float) and not isinstance(choice, bool)
                if numeric_choice and number == choice:
                    return choice
        # a word's typo (a number's nearest choices are its domain, said already)
        raise self._typo(bad, raw, [c for c in self.choices if isinstance(c, str)])

    def _off_step(self, raw: object) -> str:
        """What to do about ``raw``, a number inside the domain's range but off its steps
        (which count from ``low``); empty where it is not that."""
        if not self.step or self.low is None or self.high is None:
            return ""
        if not isinstance(raw, int | float) or isinstance(raw, bool):
            return ""
        if not self.low <= raw <= self.high:
            return ""
        below = self.low + math.floor((raw - self.low) / self.step) * self.step
        near = [v for v in (below, below + self.step) if self.low <= v <= self.high]
        return (
            f" (steps count from low {self.low:g}: the nearest are "
            + " and ".join(f"{v:g}" for v in near)
            + "): give one of them, or change low or step"
        )

    @staticmethod
    def _typo(bad: KnobError, raw: object, known: Sequence[str]) -> KnobError:
        """``bad`` with the known value(s) ``raw`` is a typo of (``knobs.names``), if any."""
        hint = did_you_mean(raw.strip() if isinstance(raw, str) else raw, known)
        if hint is None:
            return bad
        return KnobError(f"{bad.message}; {hint}", knob=bad.knob, value=bad.value)

    @staticmethod
    def _as_number(raw: object, *, integer: bool, bad: KnobError) -> float:
        if isinstance(raw, bool):
            raise bad
        if isinstance(raw, int):
            return float(raw)
        if isinstance(raw, float):
            if not math.isfinite(raw) or (integer and not raw.is_integer()):
                raise bad
            return raw
        if isinstance(raw, str):
            text = raw.strip()
            if (_INT if integer else _FLOAT).match(text):
                return float(text)
        raise bad

    def _in_range(self, value: float, bad: KnobError) -> Value:
        assert self.low is not None and self.high is not None
        if not (self.low - 1e-9 <= value <= self.high + 1e-9):
            raise bad
        if self.step:
            steps = (value - self.low) / self.step
            if abs(steps - round(steps)) > 1e-6:
                raise bad
        return int(value) if self.type == "int" else self._round(value)

    # ---- rendering --------------------------------------------------------------------------
    def rendered(self, value: Value) -> Value:
        """The value as the launcher sees it: its entry in the ``values`` map, if it has one,
        else the value itself (a partial map renders its unlisted values as themselves)."""
        if self.render.values is None:
            return value
        return self.render.values.get(_key(value), value)


def _key(value: Value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def objective_text(value: float) -> str:
    """An objective as every line, table, report and proposal's text shows it: one decimal,
    never an exponent (``10155.5``, as ``results.tsv`` has ``10155.50``)."""
    return f"{value:.1f}"


def as_text(value: Value) -> str:
    """A value as one command-line token or environment value."""
    return _key(value)
