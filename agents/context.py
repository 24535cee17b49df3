"""What a proposer sees: the knob space, the champion, the decided history, the no-go regions.

A ``ProposalContext`` is built by the orchestrator from the ledger before every proposal and
is the only input a proposer gets, so a proposer that is a pure function of it resumes after a
kill with nothing to restore.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from agents import coupled
from agents.llm_cooloff import ApiFailure
from knobs.config import Change, Config
from knobs.errors import KnobError
from knobs.space import KnobSpace
from knobs.spec import EffectPrior, Value, as_text, objective_text
from knobs.vocabulary import MEASURED, Status

#: Where a known-bad region comes from.
KnownBadSource = Literal["crash", "invalid", "veto", "constraint", "guardrail"]


def same_value(a: object, b: object) -> bool:
    """Equal as knob values: ``True`` is not ``1`` here, while ``1`` and ``1.0`` are."""
    return a == b and isinstance(a, bool) == isinstance(b, bool)


def describe_values(values: Mapping[str, Value]) -> str:
    """``knob=value, …`` in the launcher's spelling of each value."""
    return ", ".join(f"{k}={as_text(v)}" for k, v in values.items())


class HistoryEntry(BaseModel):
    """One decided experiment, as the ledger recorded it. Histories are oldest first."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    experiment: int
    #: The full config that ran.
    config: dict[str, Value]
    #: The changed knob; ``None`` for a baseline or a re-measure of the champion.
    knob: str | None
    value: Value | None
    #: A coupled move's enabling knob and its value (``agents.coupled``); else ``None``.
    coupled_knob: str | None = None
    coupled_value: Value | None = None
    status: Status
    #: ``None`` for a crash or a veto.
    objective: float | None
    #: Against the champion of the time.
    delta_pct: float | None
    #: ``Config.key`` of the champion it was compared against.
    champion_key: str
    failure_class: str | None = None
    #: What one more look at this change still promises (``E[max(0, δ)]`` under its verdict's
    #: posterior, log scale), when the verdict stopped it for want of boots and it may run
    #: again under this champion; ``None`` otherwise.
    second_look: float | None = None
    #: What one more look promises (``policy.look_promise``) when the verdict stopped it for
    #: want of boots but its second looks are spent: looked at again only when that beats
    #: what the next change not yet looked at promises (``first_looks.further_look``); else
    #: ``None``.
    further_look: float | None = None
    #: The verdict discarded it as worse than the champion or past a guardrail, under this
    #: champion (``orchestrator.policy.overshot``): for an ordered knob, a value nearer the
    #: champion's may still gain (``first_looks.step_back``).
    overshot: bool = False
    #: ``False`` for a decision nobody made on the value (``orchestrator.history``: a veto of
    #: the queue's timeout, a closure by the profile, a failure of the infrastructure's): it
    #: bars nothing, and the change may be proposed again once the context allows it.
    judged: bool = True

    @property
    def measured(self) -> bool:
        """Whether ``objective`` is a measurement a model may learn from."""
        return self.objective is not None and self.status in MEASURED

    def describe(self) -> str:
        """``experiment #7 cuda_graphs=true: keep, 101.3 (+2.1%)`` for hypotheses and logs:
        the word names the ID's kind, for a prompt that shows a proposal's ID beside it."""
        what = "baseline" if self.knob is None else f"{self.knob}={_text(self.value)}"
        if self.coupled_knob is not None:
            what += f"+{self.coupled_knob}={_text(self.coupled_value)}"
        score = "" if self.objective is None else f", {objective_text(self.objective)}"
        delta = "" if self.delta_pct is None else f" ({self.delta_pct:+.1f}%)"
        why = f" [{self.failure_class}]" if self.failure_class else ""
        return f"experiment #{self.experiment} {what}: {self.status}{score}{delta}{why}"


class KnownBad(BaseModel):
    """A region no proposer may enter: every config that has all the values of ``when``, and
    whose numeric knobs lie within ``at_least`` / ``at_most`` (each bound inclusive).

    The bounds come from failures a knob declares monotone: an out-of-memory crash at a memory
    fraction of 0.9 is ``at_least={"gpu_memory_utilization": 0.9}``; ``kv_cache_dtype=auto``
    failing for lack of KV-cache memory at a fraction of 0.85 is ``when={"kv_cache_dtype":
    "auto"}, at_most={"gpu_memory_utilization": 0.85}``, which a larger fraction leaves.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    when: dict[str, Value] = Field(default_factory=dict)
    at_least: dict[str, int | float] = Field(default_factory=dict)
    at_most: dict[str, int | float] = Field(default_factory=dict)
    reason: str
    source: KnownBadSource

    @model_validator(mode="after")
    def _some_region(self) -> KnownBad:
        if not (self.when or self.at_least or self.at_most):
            raise ValueError("a known-bad region needs a value or a bound")
        return self

    def matches(self, config: Mapping[str, Value]) -> bool:
        """Whether ``config`` falls inside this region (a knob it lacks never matches)."""
        if not all(k in config and same_value(config[k], v) for k, v in self.when.items()):
            return False
        for bounds, inside in ((self.at_least, _ge), (self.at_most, _le)):
            for knob, bound in bounds.items():
                value = config.get(knob)
                if isinstance(value, bool) or not isinstance(value, int | float):
                    return False
                if not inside(value, bound):
                    return False
        return True

    def describe(self) -> str:
        """``gpu_memory_utilization=0.9 (crash: OOM on the head)``, or with bounds
        ``kv_cache_dtype=auto, gpu_memory_utilization<=0.85 (crash: kv_capacity)``; a reason
        that says no more than the source is not said twice (``(invalid)``)."""
        said = self.reason.strip()
        why = self.source if not said or said == self.source else f"{self.source}: {said}"
        return f"{self.region()} ({why})"

    def left_by(self, config: Mapping[str, Value]) -> dict[str, str]:
        """The knobs by which ``config`` lies outside this region, each with its value against
        the region's: ``{"max_num_batched_tokens": "max_num_batched_tokens 8192 (not 7168)",
        "gpu_memory_utilization": "gpu_memory_utilization 0.88 (under 0.9)"}``; empty: the
        region contains it."""
        out: dict[str, str] = {}
        for knob, value in self.when.items():
            if knob not in config or not same_value(config[knob], value):
                out[knob] = f"{knob} {_held(config, knob)} (not {as_text(value)})"
        for bounds, inside, side in ((self.at_least, _ge, "under"), (self.at_most, _le, "over")):
            for knob, bound in bounds.items():
                held = config.get(knob)
                if isinstance(held, bool) or not isinstance(held, int | float):
                    out[knob] = f"{knob} {_held(config, knob)} (not a number)"
                elif not inside(held, bound):
                    out[knob] = f"{knob} {_held(config, knob)} ({side} {as_text(bound)})"
        return out

    def region(self) -> str:
        """The region alone: ``knob=value, …, knob>=value, knob<=value``."""
        parts = [describe_values(self.when)] if self.when else []
        parts += [f"{k}>={as_text(v)}" for k, v in self.at_least.items()]
        parts += [f"{k}<={as_text(v)}" for k, v in self.at_most.items()]
        return ", ".join(parts)

    def constrains(self, knob: str) -> bool:
        """Whether ``knob`` is part of the region."""
        return knob in self.when or knob in self.at_least or knob in self.at_most


def _held(config: Mapping[str, Value], knob: str) -> str:
    return as_text(config[knob]) if knob in config else "unset"


def _ge(value: float, bound: float) -> bool:
    return value >= bound


def _le(value: float, bound: float) -> bool:
    return value <= bound


class ChampionCell(BaseModel):
    """One bench cell of the champion, averaged over its trusted measurements: what a model of
    the draft length reads (``agents.draft_model``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    cell: str
    output_throughput: float = Field(ge=0)
    #: The share of verify steps with draft position ``i`` accepted (empty: not reported).
    per_position_acceptance: tuple[float, ...] = ()


class StepCostBelief(BaseModel):
    """What this cluster's measured K changes say of ``γ``, one draft token's verify-step cost
    as a share of the rest of a step: the verdict's posterior (``orchestrator.step_cost``, the
    one place it is fitted), marginal over the law's error, on its grid. The draft-length model
    (``agents.draft_model``) predicts with it, so a proposal and the verdict that judges it
    price a draft token alike."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    gammas: tuple[float, ...]
    #: The posterior weight of each of ``gammas``, summing to 1.
    weights: tuple[float, ...]
    #: How many K changes, measured with their counters, it rests on.
    changes: int = Field(ge=1)

    @model_validator(mode="after")
    def _a_distribution(self) -> StepCostBelief:
        if not self.gammas or len(self.gammas) != len(self.weights):
            raise ValueError("a step cost needs one weight per value of gamma")
        if any(g <= 0 for g in self.gammas) or any(w < 0 for w in self.weights):
            raise ValueError("gamma must be positive and its weights not negative")
        if abs(sum(self.weights) - 1.0) > 1e-6:
            raise ValueError(f"the weights of gamma sum to {sum(self.weights)}, not 1")
        return self

    @property
    def mean(self) -> float:
        """The posterior mean of ``γ``."""
        return sum(g * w for g, w in zip(self.gammas, self.weights, strict=True))

    @property
    def sd(self) -> float:
        """The posterior sd of ``γ``."""
        m = self.mean
        var = sum(w * (g - m) ** 2 for g, w in zip(self.gammas, self.weights, strict=True))
        return math.sqrt(var)


class Refusal(BaseModel):
    """Why a change may not run: a short ``kind`` to count by and the full ``reason``."""

    model_config = ConfigDict(frozen=True)

    kind: Literal["invalid", "decided", "known-bad"]
    reason: str


class ProposalContext(BaseModel):
    """Everything a proposer may base a proposal on. Proposers must be deterministic given it.

    Raises (on construction):
        pydantic.ValidationError: the champion does not assign exactly the space's knobs, or a
            field has the wrong type.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    space: KnobSpace
    champion: Config
    champion_objective: float | None
    history: tuple[HistoryEntry, ...]
    known_bad: tuple[KnownBad, ...]
    #: ``Config.key`` of every config already decided under this champion: never propose again.
    decided_keys: frozenset[str]
    budget_left: int = Field(ge=0)
    #: The round's seed.
    seed: int
    #: The user's research brief (for LLM proposers).
    brief: str = ""
    #: USD already spent on LLM calls in this round: the sum of the ``llm_cost_usd`` notes of
    #: the round's recorded proposals (``agents.llm.round_spend``), so that a resumed round
    #: still honours the profile's cap.
    llm_spend_usd: float = Field(default=0.0, ge=0)
    #: The cluster's proposals whose LLM proposer asked the API and failed since it last
    #: answered, oldest first (``agents.llm_cooloff.api_failures``, from the ledger): a new
    #: process (a resumed round, the next night's) goes on with the API's cool-off.
    api_failures: tuple[ApiFailure, ...] = ()
    #: The champion's cells, averaged over its trusted measurements (empty before any).
    champion_cells: tuple[ChampionCell, ...] = ()
    #: Each knob's effect prior in force on this cluster: its spec's (or the profile's)
    #: updated by the changes of it the ledger measured (``orchestrator.priors``). A knob
    #: missing here has its spec's ``effect_prior`` (``prior``).
    knob_priors: dict[str, EffectPrior] = Field(default_factory=dict)
    #: Knobs whose change to one value measured different effects under two champions (a
    #: learned interaction): looked at again when the champion moves.
    interacting: frozenset[str] = frozenset()
    #: The step cost of a draft token as this cluster's K changes taught it (``None``: none
    #: measured with its counters yet; the draft-length model then uses its prior).
    step_cost: StepCostBelief | None = None

    @model_validator(mode="after")
    def _champion_fits(self) -> ProposalContext:
        names = set(self.space.names)
        if set(self.champion) != names:
            missing = sorted(names - set(self.champion))
            extra = sorted(set(self.champion) - names)
            raise ValueError(f"champion does not fit the space: missing {missing}, extra {extra}")
        return self

    def prior(self, knob: str) -> EffectPrior | None:
        """The effect prior in force for ``knob``: the learned one, else its spec's."""
        learned = self.knob_priors.get(knob)
        return learned if learned is not None else self.space.spec(knob).effect_prior

    def refusal(self, change: Change) -> Refusal | None:
        """``None`` if ``change`` may run now, else why not.

        Never raises: a change that does not validate is refused with the validation message.
        A coupled move (two knobs) runs only where ``agents.coupled`` opens one.
        """
        valid: Change | None = None
        for move in change.moves():
            try:
                one = self.space.change(self.champion, move.knob, move.new)
            except KnobError as e:
                return Refusal(kind="invalid", reason=e.message)
            if not same_value(move.old, one.old):
                return Refusal(
                    kind="invalid",
                    reason=f"stale change: the champion's {move.knob} is {as_text(one.old)}, "
                    f"not {_text(move.old)}",
                )
            if not same_value(move.new, one.new) or type(move.new) is not type(one.new):
                return Refusal(
                    kind="invalid",
                    reason=f"knob {move.knob}: write {move.new!r} as {as_text(one.new)}",
                )
            valid = one if valid is None else valid.model_copy(update={"enabling": one})
        assert valid is not None
        if valid.enabling is not None:
            try:
                self.space.check_constraints(self.champion.apply(valid))
            except KnobError as e:
                return Refusal(kind="invalid", reason=e.message)
            why_not = coupled.refusal_reason(self, valid)
            if why_not is not None:
                return Refusal(kind="invalid", reason=why_not)
        candidate = self.champion.apply(valid)
        if candidate.key in self.decided_keys:
            return Refusal(kind="decided", reason=self._decided_words(valid, candidate))
        for region in self.known_bad:
            if region.matches(candidate):
                return Refusal(
                    kind="known-bad",
                    reason=f"{valid.describe()} enters a known-bad region: {region.describe()}",
                )
        return None

    def allowed(self, change: Change) -> str | None:
        """``None`` if ``change`` may run now, else the reason it may not.

        A change is allowed when ``space.change`` validates it (known knob, value of the domain,
        a real change, no forbidden combination), its ``old`` is the champion's value, its
        ``new`` is written as the domain writes it, the resulting config was not decided under
        this champion and it lies in no known-bad region. Never raises.
        """
        refused = self.refusal(change)
        return None if refused is None else refused.reason

    def candidates(self) -> list[Change]:
        """Every allowed one-knob change away from the champion, in ``space.neighbours`` order."""
        return [c for c in self.space.neighbours(self.champion) if self.refusal(c) is None]

    def coupled_moves(self) -> list[coupled.CoupledMove]:
        """The coupled moves open under this champion (``agents.coupled``), oldest failure
        first: the only two-knob changes ``refusal`` allows."""
        return coupled.open_moves(self)

    def refusals(self, changes: Iterable[Change]) -> dict[str, int]:
        """How many of ``changes`` are refused, counted by refusal kind (allowed ones omitted)."""
        counts: Counter[str] = Counter()
        for change in changes:
            refused = self.refusal(change)
            if refused is not None:
                counts[refused.kind] += 1
        return dict(sorted(counts.items()))

    def _decided_words(self, change: Change, candidate: Config) -> str:
        """Why ``change`` (to ``candidate``) is not proposed again under this champion: a
        person's veto is named, with its reason and the command that lifts it; a veto of the
        queue's timeout (one that bars no region) says so."""
        vetoed = [
            e
            for e in self.history
            if e.status == Status.VETOED
            and e.champion_key == self.champion.key
            and Config(e.config).key == candidate.key
        ]
        if not vetoed:
            decided = [
                e
                for e in self.history
                if e.champion_key == self.champion.key and Config(e.config).key == candidate.key
            ]
            which = (
                f"experiment #{decided[-1].experiment}, {decided[-1].status}"
                if decided
                else f"config {candidate.key}"
            )
            return f"{change.describe()} was already decided under this champion ({which})"
        n = vetoed[-1].experiment
        why = next(
            (r.reason for r in self.known_bad if r.source == "veto" and r.matches(candidate)), None
        )
        if why is None:
            # a veto that bars no region: the queue's timeout's (``history.timed_out``), held
            # for the rest of its sitting; nobody judged it, and there is nothing to clear
            return (
                f"{change.describe()} was vetoed under this champion by the queue's timeout "
                f"(experiment #{n}: nobody decided it); it may be proposed again once the "
                "round resumes"
            )
        said = f": {why}" if why else ""
        return (
            f"{change.describe()} was vetoed under this champion (experiment #{n}{said}); "
            f"`orchestrate known-bad clear {n} --reason TEXT` lets it run again"
        )

    def risk_of(self, change: Change) -> str:
        """What the history and the known-bad regions say about the risk of ``change``."""
        knob = change.knob
        parts: list[str] = []
        failed = [e for e in self.history if e.knob == knob and not e.measured]
        if failed:
            parts.append(f"{knob} failed before: " + "; ".join(e.describe() for e in failed[-3:]))
        near = self._regions_near(change)
        if near:
            parts.append("known-bad regions near it: " + "; ".join(near[:3]))
        if not self.tries(knob, change.new):
            parts.append(f"{knob}={_text(change.new)} was never run as a change")
        return "; ".join(parts) if parts else "low: this knob and value ran before without failing"

    def _regions_near(self, change: Change) -> list[str]:
        """The known-bad regions on a knob ``change`` moves that hold its new value (or bound
        it), each said with how the config it makes stands to it: inside it, or outside it by
        which knobs. A region of another value of a moved knob (a point ``K=5`` for a change to
        4) says nothing of this change's risk, and is left out."""
        candidate = self.champion.apply(change)
        moved = [m.knob for m in change.moves()]
        out: list[str] = []
        for region in self.known_bad:
            if not any(region.constrains(k) for k in moved):
                continue
            outside = region.left_by(candidate)
            if any(k in region.when and k in outside for k in moved):
                continue
            if not outside:
                out.append(f"{region.describe()}, which holds this config")
            else:
                out.append(f"{region.describe()}, outside it by " + ", ".join(outside.values()))
        return out

    def tries(self, knob: str, value: Value | None = None, *, judged: bool = False) -> int:
        """How many history entries changed ``knob`` (to ``value``, when given); ``judged``:
        only those whose value was judged (``HistoryEntry.judged``)."""
        return sum(
            1
            for e in self.history
            if e.knob == knob
            and (value is None or same_value(e.value, value))
            and (e.judged or not judged)
        )


def _text(value: object) -> str:
    if isinstance(value, bool | int | float | str):
        return as_text(value)
    return repr(value)
