"""The ``propose_change`` tool: its input schema, generated from the knob space, and the
validation of what the model put in it (one knob, one value of its domain, the reasoning
fields cleaned)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agents.context import ProposalContext
from agents.llm import clean_text
from agents.proposal import ONE_EXPERIMENT
from knobs.config import Change
from knobs.errors import KnobError
from knobs.space import KnobSpace
from knobs.spec import KnobSpec, Value, printable

#: The tool Claude must call.
TOOL = "propose_change"
#: Where the objective is expected to move.
DIRECTIONS = ("higher", "lower", "unchanged")


# ---- the tool schemas ---------------------------------------------------------------------------
#: Enumerate a numeric domain in the schema up to this many values (else type and range only).
MAX_ENUM = 128


def value_schema(spec: KnobSpec) -> dict[str, Any]:
    """The JSON schema of one knob's values (an ``enum`` of its finite domain where short)."""
    values = spec.domain()
    schema: dict[str, Any]
    if spec.type == "bool":
        schema = {"type": "boolean"}
    elif spec.type in ("int", "float"):
        kind = "integer" if spec.type == "int" else "number"
        schema = {"type": kind, "enum": values} if len(values) <= MAX_ENUM else {"type": kind}
    else:
        kinds = {_json_type(v) for v in values}
        schema = {"type": kinds.pop(), "enum": values} if len(kinds) == 1 else {"enum": values}
    schema["description"] = f"{spec.name}: {spec.describe_domain()}"
    return schema


def _json_type(value: Value) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    return "string"


#: The fields every proposal tool takes besides the change itself.
EFFECT_PROPERTIES: dict[str, Any] = {
    "hypothesis": {
        "type": "string",
        "description": "Why this change should move the objective, citing the evidence in "
        "the digest (one to three sentences).",
    },
    "expected_direction": {
        "type": "string",
        "enum": list(DIRECTIONS),
        "description": "Where the objective should move against the champion.",
    },
    "expected_size_pct": {
        "type": "number",
        "description": "How far, in percent of the champion's objective (e.g. 3.5).",
    },
    "risk": {
        "type": "string",
        "description": "What could go wrong (a boot that fails, out of memory, wrong greedy "
        "outputs, a gain lost in noise) and how likely it is.",
    },
    "estimated_cost": {
        "type": "string",
        "description": "What the experiment costs: boots, bench time, and any risk of a long "
        "failed boot.",
    },
}


def tool_schema(properties: Mapping[str, Any]) -> dict[str, Any]:
    """An object schema over ``properties`` plus the effect fields, all required, no others
    (the shape the API's strict mode asks for)."""
    merged = {**properties, **EFFECT_PROPERTIES}
    return {
        "type": "object",
        "properties": merged,
        "required": list(merged),
        "additionalProperties": False,
    }


def change_tool(space: KnobSpace, *, strict: bool) -> dict[str, Any]:
    """The ``propose_change`` tool for ``space``: ``knob`` is an enum of the knob names,
    ``value`` one branch per knob domain."""
    branches: list[dict[str, Any]] = []
    seen: dict[str, dict[str, Any]] = {}
    for spec in space.knobs:
        schema = value_schema(spec)
        shape = json.dumps({k: v for k, v in schema.items() if k != "description"}, sort_keys=True)
        if shape in seen:  # two knobs with the same domain share a branch
            seen[shape]["description"] += "; " + schema["description"]
            continue
        seen[shape] = schema
        branches.append(schema)
    properties = {
        "knob": {
            "type": "string",
            "enum": space.names,
            "description": "The one knob to change from the champion's value.",
        },
        "value": {
            "anyOf": branches,
            "description": "The knob's new value: one of that knob's domain (the branch "
            "named after the knob).",
        },
    }
    tool: dict[str, Any] = {
        "name": TOOL,
        "description": "Propose the next experiment: exactly one knob of the champion "
        "configuration set to one new value of its domain, with the hypothesis behind it, "
        "the expected effect on the objective, the risk and the cost.",
        "input_schema": tool_schema(properties),
    }
    if strict:
        tool["strict"] = True
    return tool


# ---- validation of what the model proposed ------------------------------------------------------
@dataclass(frozen=True)
class Effect:
    """The reasoning fields of a proposal, cleaned."""

    hypothesis: str
    direction: str
    size_pct: float
    risk: str
    estimated_cost: str

    def notes(self) -> dict[str, str]:
        """``expected_direction`` and ``expected_size_pct`` for the proposal's notes."""
        return {"expected_direction": self.direction, "expected_size_pct": f"{self.size_pct:g}"}

    def expected(self) -> str:
        """``higher by about 3.5%`` and the like."""
        if self.direction == "unchanged":
            return f"unchanged (within about {self.size_pct:g}%)"
        return f"objective {self.direction} by about {self.size_pct:g}%"


def read_effect(data: Mapping[str, object]) -> Effect | str:
    """The effect fields of a tool input, or why they are not acceptable."""
    hypothesis = clean_text(data.get("hypothesis"))
    risk = clean_text(data.get("risk"))
    cost = clean_text(data.get("estimated_cost"), 300)
    direction = data.get("expected_direction")
    size = data.get("expected_size_pct")
    if not hypothesis:
        return "hypothesis must be a non-empty string"
    if not risk:
        return "risk must be a non-empty string"
    if direction not in DIRECTIONS:
        return f"expected_direction {printable(direction)} is not one of {', '.join(DIRECTIONS)}"
    if (
        isinstance(size, bool)
        or not isinstance(size, int | float)
        or not (0 <= float(size) <= 1000)
    ):
        return f"expected_size_pct {printable(size)} is not a number from 0 to 1000"
    return Effect(hypothesis, str(direction), float(size), risk, cost or ONE_EXPERIMENT)


def one_knob_problem(data: object, space: KnobSpace, fields: Sequence[str]) -> str | None:
    """Why a tool input is not one change of one knob (``None`` if its shape is right)."""
    if not isinstance(data, dict):
        return (
            f"the input must be a JSON object with the fields {', '.join(fields)}, "
            f"not {printable(data)}"
        )
    knob = data.get("knob")
    extra = sorted(str(k) for k in data if k not in fields)
    if isinstance(knob, list | dict) or any(k in space.names for k in extra):
        return (
            "exactly one knob per proposal: an experiment changes one knob so that its effect "
            "can be measured; propose the most promising one alone"
        )
    if extra:
        return f"unexpected fields {', '.join(printable(k) for k in extra)}; the fields are " + (
            ", ".join(fields)
        )
    missing = [f for f in fields if f not in data]
    if missing:
        return f"missing fields: {', '.join(missing)}"
    return None


def change_of(context: ProposalContext, data: Mapping[str, object]) -> Change | str:
    """The validated change a tool input names, or why it may not run now."""
    try:
        change = context.space.change(context.champion, data.get("knob"), data.get("value"))
    except KnobError as e:
        return e.message
    refused = context.refusal(change)
    if refused is not None:
        return refused.reason
    return change
