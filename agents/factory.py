"""``make_proposer``: a proposer from its kind (``--proposer``) and the profile's options."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agents.optuna_proposer import OptunaProposer
from agents.proposal import Proposer
from agents.sweep import SweepProposer
from knobs.errors import KnobError, UsageError
from knobs.spec import Value

_Options = TypeVar("_Options", bound=BaseModel)

#: Every kind ``make_proposer`` knows, built now or arriving later.
KINDS: tuple[str, ...] = ("optuna", "sweep", "claude", "hybrid")

#: Kinds that are named in the command line contract but not built yet.
LATER: frozenset[str] = frozenset({"claude", "hybrid"})


class OptunaOptions(BaseModel):
    """The options of the ``optuna`` proposer."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    n_startup: int = Field(default=4, ge=0)
    direction: Literal["maximize", "minimize"] = "maximize"


class SweepOptions(BaseModel):
    """The options of the ``sweep`` proposer: ``changes`` is a list of ``{knob: value}``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    changes: list[dict[str, Value]] | None = None


#: The options model of every kind that is built.
_OPTIONS: dict[str, type[BaseModel]] = {"optuna": OptunaOptions, "sweep": SweepOptions}


def make_proposer(kind: str, *, seed: int, options: Mapping[str, object]) -> Proposer:
    """The proposer of ``kind`` with ``options`` (from the profile), seeded with ``seed``.

    ``options`` may hold options of other kinds (a profile's sweep list while ``--proposer
    optuna`` overrides its kind): those are ignored; a name no kind takes is an error.

    Raises:
        UsageError: an unknown kind, a kind that is not built yet (claude, hybrid), an option
            no proposer takes, or an option of the wrong type or value.
    """
    if kind in LATER:
        raise UsageError(f"the {kind} proposer arrives with issue #6; use optuna or sweep")
    if kind not in _OPTIONS:
        raise UsageError(f"unknown proposer {kind!r}; known: {', '.join(KINDS)}")
    accepted = sorted({name for model in _OPTIONS.values() for name in model.model_fields})
    unknown = sorted(str(name) for name in options if name not in accepted)
    if unknown:
        raise UsageError(
            f"unknown proposer options: {', '.join(unknown)} (accepted: {', '.join(accepted)})"
        )
    if kind == "optuna":
        optuna_options = _parse(OptunaOptions, kind, options)
        return OptunaProposer(
            seed=seed, n_startup=optuna_options.n_startup, direction=optuna_options.direction
        )
    sweep_options = _parse(SweepOptions, kind, options)
    try:
        return SweepProposer(sweep_options.changes)
    except KnobError as e:
        raise UsageError(f"sweep proposer: {e.message}") from e


def _parse(model: type[_Options], kind: str, options: Mapping[str, object]) -> _Options:
    own = {name: value for name, value in options.items() if name in model.model_fields}
    try:
        return model.model_validate(own)
    except ValidationError as e:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'options'}: {err['msg']}"
            for err in e.errors()
        )
        raise UsageError(f"{kind} proposer options: {problems}") from e
