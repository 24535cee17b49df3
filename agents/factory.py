"""``make_proposer``: a proposer from its kind (``--proposer``) and the profile's options."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agents.claude import ClaudeProposer
from agents.hybrid import HybridProposer
from agents.llm import ClaudeOptions
from agents.optuna_proposer import OptunaProposer
from agents.proposal import Proposer
from agents.sweep import SweepProposer
from knobs.errors import KnobError
from knobs.spec import Value
from orchestrator.errors import UsageError

_Options = TypeVar("_Options", bound=BaseModel)

#: Every kind ``make_proposer`` knows.
KINDS: tuple[str, ...] = ("optuna", "sweep", "claude", "hybrid")


class OptunaOptions(BaseModel):
    """The options of the ``optuna`` proposer (also the fallback of ``claude`` and the value
    picker of ``hybrid``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    n_startup: int = Field(default=4, ge=0)
    direction: Literal["maximize", "minimize"] = "maximize"
    #: give the knobs known to matter (K, CUDA graphs) a first look under each champion
    first_looks: bool = True
    #: order the draft length's first looks by the draft-length model (``agents.draft_model``)
    draft_model: bool = True


class SweepOptions(BaseModel):
    """The options of the ``sweep`` proposer: ``changes`` is a list of ``{knob: value}``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    changes: list[dict[str, Value]] | None = None


#: The options models each kind reads.
_OPTIONS: dict[str, tuple[type[BaseModel], ...]] = {
    "optuna": (OptunaOptions,),
    "sweep": (SweepOptions,),
    "claude": (ClaudeOptions, OptunaOptions),
    "hybrid": (ClaudeOptions, OptunaOptions),
}


def make_proposer(
    kind: str, *, seed: int, options: Mapping[str, object], base_url: str | None = None
) -> Proposer:
    """The proposer of ``kind`` with ``options`` (from the profile), seeded with ``seed``.

    ``options`` may hold options of other kinds (a profile's sweep list while ``--proposer
    optuna`` overrides its kind): those are ignored; a name no kind takes is an error.
    ``claude`` and ``hybrid`` read the Claude options (``ClaudeOptions``) and the Optuna ones
    (for their fallback and, in hybrid, the value); ``base_url`` defaults to
    ``$ANTHROPIC_BASE_URL``.

    Raises:
        UsageError: an unknown kind, an option no proposer takes, an option of the wrong type
            or value, or a brief file that cannot be read.
        MissingApiKey: ``claude`` or ``hybrid`` without ``ANTHROPIC_API_KEY`` (exit 7).
    """
    if kind not in _OPTIONS:
        raise UsageError(f"unknown proposer {kind!r}; known: {', '.join(KINDS)}")
    accepted = sorted(
        {name for models in _OPTIONS.values() for model in models for name in model.model_fields}
    )
    unknown = sorted(str(name) for name in options if name not in accepted)
    if unknown:
        raise UsageError(
            f"unknown proposer options: {', '.join(unknown)} (accepted: {', '.join(accepted)})"
        )
    if kind == "sweep":
        sweep_options = _parse(SweepOptions, kind, options)
        try:
            return SweepProposer(sweep_options.changes)
        except KnobError as e:
            raise UsageError(f"sweep proposer: {e.message}") from e
    optuna_options = _parse(OptunaOptions, kind, options)
    optuna = OptunaProposer(
        seed=seed,
        n_startup=optuna_options.n_startup,
        direction=optuna_options.direction,
        first_looks=optuna_options.first_looks,
        draft_model=optuna_options.draft_model,
    )
    if kind == "optuna":
        return optuna
    claude_options = _parse(ClaudeOptions, kind, options)
    if kind == "claude":
        return ClaudeProposer(claude_options, fallback=optuna, base_url=base_url)
    return HybridProposer(claude_options, optuna=optuna, base_url=base_url)


def _parse(model: type[_Options], kind: str, options: Mapping[str, object]) -> _Options:
    own = {name: value for name, value in options.items() if name in model.model_fields}
    try:
        return model.model_validate(own)
    except ValidationError as e:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'options'}: "
            f"{err['msg'].removeprefix('Value error, ')}"
            for err in e.errors()
        )
        raise UsageError(f"{kind} proposer options: {problems}") from e
