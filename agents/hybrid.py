"""The hybrid proposer: Claude chooses the knob and the direction, Optuna the value inside it.

Claude reads the same brief and digest as the Claude proposer and calls ``choose_knob`` with a
knob (an enum of the knob names), a direction (``up``: a later value of the knob's domain as
listed, a larger number, ``true`` for a switch; ``down``: an earlier one; ``any``) and its
reasoning. The choice is refused back to the model as a tool error when the knob is unknown or
has no allowed value that way. TPE, fitted on the whole history as in the Optuna proposer,
then samples that knob alone; the first sample that lands among the allowed values in that
direction is the change (after a dozen misses: the allowed value nearest the champion that
way). For the draft length (``role: draft_tokens``) the value is the one the draft-length model
predicts best in that direction, from the champion's per-position acceptance
(``agents.draft_model``), as in the Optuna proposer's first looks, and the expected effect is
the model's prediction as the Optuna proposer says it: Claude's own expectation stays in the
notes (``expected_direction``, ``expected_size_pct``), and is said beside the model's where
their directions differ, or where they agree but their sizes are far apart (``FAR_APART``:
Claude +4 %, the model +18.3 %). When Claude gives no usable choice, the Optuna proposer
proposes on its own, recorded as a fallback.
"""

from __future__ import annotations

from typing import Any

from agents.claude import SYSTEM, LLMProposer
from agents.context import ProposalContext, same_value
from agents.draft_model import DraftPrediction, predict
from agents.llm import ClaudeOptions
from agents.llm_tool import EFFECT_PROPERTIES, Effect, one_knob_problem, read_effect, tool_schema
from agents.optuna_proposer import MAX_ASKS, OptunaProposer, distributions
from agents.proposal import Direction, Proposal, open_coupled
from knobs.config import Change
from knobs.errors import KnobError
from knobs.space import KnobSpace
from knobs.spec import KnobSpec, Value, as_text, printable

#: The tool Claude must call in hybrid mode.
TOOL = "choose_knob"
#: Which way along a knob's domain.
WAYS = ("up", "down", "any")

HYBRID_SYSTEM = (
    SYSTEM.replace("propose_change", TOOL).replace(
        "with one knob and one value from that knob's domain",
        "with one knob and the direction to move it; an optimiser (TPE) then picks the value "
        "in that direction from the history",
    )
    + "- Directions: up = a later value of the knob's domain as listed (a larger number, true "
    "for a switch), down = an earlier one, any = let the optimiser choose.\n"
)


def knob_tool(space: KnobSpace, *, strict: bool) -> dict[str, Any]:
    """The ``choose_knob`` tool: ``knob`` an enum of the knob names, ``direction`` a way."""
    properties = {
        "knob": {
            "type": "string",
            "enum": space.names,
            "description": "The one knob to move away from the champion's value.",
        },
        "direction": {
            "type": "string",
            "enum": list(WAYS),
            "description": "up: a later value of the knob's domain as listed (larger; true for "
            "a switch); down: an earlier one; any: either.",
        },
    }
    tool: dict[str, Any] = {
        "name": TOOL,
        "description": "Choose the next experiment's knob and the direction to move it; an "
        "optimiser picks the value. Give the hypothesis, expected effect, risk and cost.",
        "input_schema": tool_schema(properties),
    }
    if strict:
        tool["strict"] = True
    return tool


def way_of(spec: KnobSpec, old: Value, new: Value) -> str | None:
    """``up`` when ``new`` comes after ``old`` in the knob's domain as listed, else ``down``.
    An ``old`` the domain lacks (a champion's value the profile narrowed the domain under): by
    number for an ordered knob, and ``None`` (either way) for one without an order."""
    here = _place(spec, old)
    there = _place(spec, new)
    if here is None or there is None:
        return None
    return "up" if there > here else "down"


def _place(spec: KnobSpec, value: Value) -> float | None:
    """Where ``value`` lies along the knob's domain: its index in the listing, or for an
    ordered knob's value outside it, between the indexes of its neighbours; ``None`` for an
    unordered knob's value the listing lacks."""
    domain = spec.domain()
    order = [as_text(v) for v in domain]
    if as_text(value) in order:
        return float(order.index(as_text(value)))
    if not spec.ordered or isinstance(value, bool) or not isinstance(value, int | float):
        return None
    numbers = [float(v) for v in domain if isinstance(v, int | float)]
    below = sum(1 for x in numbers if x < value)  # the domain's values under it, in order
    return below - 0.5


class HybridProposer(LLMProposer):
    """Claude picks the knob and direction (forced ``choose_knob`` tool use); TPE picks the
    value. ``optuna`` samples the value and is the fallback."""

    name = "hybrid"

    def __init__(
        self,
        options: ClaudeOptions,
        *,
        optuna: OptunaProposer,
        base_url: str | None = None,
    ) -> None:
        """Raises:
        MissingApiKey: no API key is set.
        UsageError: the brief file cannot be read.
        """
        super().__init__(options, fallback=optuna, base_url=base_url)
        self.optuna = optuna

    def propose(self, context: ProposalContext) -> Proposal:
        """Claude's knob and direction with TPE's value, or the Optuna proposer's proposal
        with the reason in ``llm_fallback``.

        Raises:
            ProposalExhausted: no allowed one-knob change is left (checked before any call).
            LLMError: the API refused the request for a reason a retry cannot fix.
        """
        coupled = open_coupled(context, self.name)  # before any call: see ``open_coupled``
        if coupled is not None:
            return coupled
        tool = knob_tool(context.space, strict=self.options.strict_tools)

        def validate(data: object) -> Proposal | str:
            return self._choice(context, data)

        outcome, spent = self._converse(context, tool, HYBRID_SYSTEM, validate)
        return self._finish(context, outcome, spent)

    def _choice(self, context: ProposalContext, data: object) -> Proposal | str:
        fields = ("knob", "direction", *EFFECT_PROPERTIES)
        problem = one_knob_problem(data, context.space, fields)
        if problem is not None:
            return problem
        assert isinstance(data, dict)
        try:
            spec = context.space.spec(data.get("knob"))
        except KnobError as e:
            return e.message
        way = data.get("direction")
        if way not in WAYS:
            return f"direction {printable(way)} is not one of {', '.join(WAYS)}"
        old = context.champion[spec.name]
        allowed = [c for c in context.candidates() if c.knob == spec.name]
        inside = [c for c in allowed if way == "any" or way_of(spec, old, c.new) in (way, None)]
        if not inside:
            now = ", ".join(as_text(c.new) for c in allowed) or "none"
            return (
                f"knob {spec.name} has no allowed value {way} from the champion's "
                f"{as_text(old)} (allowed now: {now})"
            )
        effect = read_effect(data)
        if isinstance(effect, str):
            return effect
        return self._proposal(context, spec, str(way), inside, effect)

    def _proposal(
        self,
        context: ProposalContext,
        spec: KnobSpec,
        way: str,
        inside: list[Change],
        effect: Effect,
    ) -> Proposal:
        change, how, model = self._value(context, spec, inside)
        choices = ", ".join(as_text(c.new) for c in inside)
        return Proposal(
            change=change,
            source=self.name,
            hypothesis=f"{effect.hypothesis} [Claude chose {spec.name} {way}; {how} picked "
            f"{as_text(change.new)} among {choices}.]",
            expected_effect=effect.expected()
            if model is None
            else _expected(model, int(change.new), self.optuna.direction, effect),
            risk=effect.risk,
            estimated_cost=effect.estimated_cost,
            notes={**effect.notes(), "direction": way, "value_by": how},
        )

    def _value(
        self, context: ProposalContext, spec: KnobSpec, inside: list[Change]
    ) -> tuple[Change, str, DraftPrediction | None]:
        """The draft-length model's best value among ``inside`` for the draft knob (when the
        Optuna proposer uses the model), else TPE's value among ``inside``, or the one nearest
        the champion; how it was picked, and the model when the model picked it."""
        model = predict(context) if self.optuna.draft_model else None
        if model is not None and model.knob == spec.name:
            best = model.best_of(inside)
            return best, f"the draft-length model ({model.describe(int(best.new))})", model
        dists = distributions(context.space)
        study, _ = self.optuna.study(context, dists)
        for asks in range(1, MAX_ASKS + 1):
            raw = study.ask({spec.name: dists[spec.name]}).params[spec.name]
            try:
                value = spec.parse(raw)
            except KnobError:  # unreachable: TPE samples inside the distribution
                continue
            for change in inside:
                if same_value(change.new, value):
                    return change, f"TPE (ask {asks})", None
        here = _place(spec, context.champion[spec.name])
        nearest = min(inside, key=lambda c: abs((_place(spec, c.new) or 0.0) - (here or 0.0)))
        return nearest, f"the nearest allowed value (TPE missed {MAX_ASKS} times)", None


def _expected(model: DraftPrediction, value: int, direction: Direction, effect: Effect) -> str:
    """The expected effect of a K value the draft-length model picked: the model's prediction
    (``DraftPrediction.expected``), with Claude's own expectation beside it where it points
    another way (the model says better while Claude said lower, say), or the same way by a
    size ``FAR_APART`` from the model's (Claude +4 %, the model +18.3 %)."""
    said = model.expected(value, direction)
    pct = model.change_pct[value]
    way = "unchanged" if abs(pct) < 0.5 else "higher" if pct > 0 else "lower"
    if effect.direction == way and way != "unchanged":
        if not _far_apart(abs(pct), effect.size_pct):
            return said
        return (
            f"{said}; Claude expected the objective {way} too, by about {effect.size_pct:g}% "
            f"against the model's {pct:+.1f}%"
        )
    if effect.direction == "unchanged" and abs(pct) <= max(effect.size_pct, 0.5):
        return said
    claude = (
        f"unchanged (within about {effect.size_pct:g}%)"
        if effect.direction == "unchanged"
        else f"{effect.direction} by about {effect.size_pct:g}%"
    )
    return f"{said}; Claude expected the objective {claude}"


#: Claude's expected size and the model's, the same way, are far apart when one is more than
#: this many times the other and they differ by more than ``FAR_POINTS`` percentage points.
FAR_APART = 2.0
FAR_POINTS = 2.0


def _far_apart(model_pct: float, claude_pct: float) -> bool:
    """Whether two expected sizes of one direction (percent, both positive) are far apart."""
    low, high = sorted((model_pct, claude_pct))
    return high - low > FAR_POINTS and high > FAR_APART * low
