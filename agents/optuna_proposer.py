"""The Optuna proposer: TPE over the whole knob space, narrowed to one knob away from the champion.

Stateless between calls: every ``propose`` rebuilds an in-memory study from the context's
history, so a killed round resumes with nothing to restore and the same context always gives
the same proposal.

How history becomes trials: ``agents.tpe_study``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import TrialState

from agents.context import HistoryEntry, ProposalContext, same_value
from agents.draft_model import DraftPrediction, predict
from agents.first_looks import DRAFT_LOOK_FLOOR as DRAFT_LOOK_FLOOR  # re-exported
from agents.first_looks import first_look as first_look  # re-exported
from agents.first_looks import further_look, open_changes, second_look, seed_for, why
from agents.proposal import (
    ONE_EXPERIMENT,
    Direction,
    Proposal,
    ProposalExhausted,
    open_coupled,
    versus,
)
from agents.tpe_study import History, as_params, infeasible, study_of
from agents.tpe_study import distributions as distributions  # re-exported
from knobs.config import Change
from knobs.spec import KnobSpec, Value, as_text

#: How many times ``study.ask`` is tried before the deterministic fallback. Each extra ask sees
#: the earlier ones as running trials (TPE's constant liar), so it lands somewhere else.
MAX_ASKS = 12


class OptunaProposer:
    """Ask/tell with TPE over the knob space, one knob away from the champion.

    First looks: a knob known to matter (its spec's ``effect_prior`` says fewer than half of
    its changes do nothing: K, CUDA graphs) is changed before TPE's preferences take over — to
    every value of its domain under each champion when it has at most ``FIRST_LOOK_VALUES``
    (a sweep of K; CUDA graphs' one other value), once when it has more — the likeliest to
    matter first (the lowest ``p_null``, then the least tried, then a seeded hash), the value
    TPE's draw among the values left. Going back to the champion this one replaced is no first
    look (that comparison was just decided), and a knob whose changes failed to boot
    ``FIRST_LOOK_CRASHES`` times with one failure class gets no more (every K but 7 wedges one
    stack's boot). Without first looks, TPE, which models only the configs it has seen, may
    never move a knob its history never moved: CUDA graphs left off for a whole run, or K never
    tried below 4. Knobs that declare nothing, or that rarely matter, are left to TPE (a first
    look at each under every champion would spend the budget on them).

    The draft length (the knob with ``role: draft_tokens``) is looked at in the order the
    draft-length model (``agents.draft_model``) predicts from the champion's per-position
    acceptance, best first, and a value predicted more than ``DRAFT_LOOK_FLOOR`` % worse than
    the champion gets no first look: K=2 first where it is best, instead of whichever value
    TPE drew (a keep of K=1 first leaves the +2 % step to K=2 below what the verdict can see).

    TPE (seeded from the proposer's seed, the round's seed and the history's length) suggests a
    whole config. Of the knobs where it differs from the champion (during a first look: only
    the knob looked at, at a value left to look at), the one taken is the knob changed least
    often relative to how much it has been seen to matter (``tries / (1 + √ of the largest
    |delta_pct| of its measured changes)``), so untried knobs come first and flat ones fade;
    among equals, the one TPE moved furthest (as a fraction of its domain; a categorical move
    counts as the whole domain); then a seeded hash. That knob at TPE's value is the change.
    When a dozen asks give no allowed change, the fallback is the allowed neighbour whose knob,
    then value, was tried least (ties by the seeded hash); during a first look, the least-tried
    value left to look at.
    """

    name = "optuna"

    def __init__(
        self,
        seed: int = 0,
        n_startup: int = 4,
        *,
        direction: Direction = "maximize",
        first_looks: bool = True,
        draft_model: bool = True,
    ) -> None:
        """``first_looks=False``: TPE's preferences alone, from the first proposal (as before
        first looks existed; kept to measure them). ``draft_model=False``: the draft knob's
        first looks in TPE's order, every value (as before the draft-length model).

        Raises:
        ValueError: ``n_startup`` is negative or ``direction`` is neither maximize nor minimize.
        """
        if n_startup < 0:
            raise ValueError(f"n_startup must be >= 0, not {n_startup}")
        if direction not in ("maximize", "minimize"):
            raise ValueError(f"direction must be maximize or minimize, not {direction!r}")
        self.seed = seed
        self.n_startup = n_startup
        self.direction: Direction = direction
        self.first_looks = first_looks
        self.draft_model = draft_model
        optuna.logging.set_verbosity(optuna.logging.WARNING)

    def propose(self, context: ProposalContext) -> Proposal:
        """TPE's suggestion, narrowed to one allowed knob change away from the champion.

        A coupled move open under this champion (``agents.coupled``: a value that failed to
        boot for a reason another knob explains, with that knob's next value) comes first,
        with first looks on: it finishes the look whose boot failed for a named cause.

        Raises:
            ProposalExhausted: no allowed one-knob change is left.
        """
        coupled = open_coupled(context, self.name) if self.first_looks else None
        if coupled is not None:
            return coupled
        allowed = context.candidates()
        if not allowed:
            neighbours = context.space.neighbours(context.champion)
            raise ProposalExhausted.after(
                self.name, len(neighbours), context.refusals(neighbours), what="neighbours"
            )
        dists = distributions(context.space)
        sampler_seed = seed_for(self.seed, context.seed, len(context.history))
        study, read = self.study(context, dists)
        completed = sum(1 for t in study.trials if t.state == TrialState.COMPLETE)
        model = predict(context) if self.first_looks and self.draft_model else None
        first = first_look(context, allowed, sampler_seed, model) if self.first_looks else None
        looks = [] if first is None else first[1]
        again = second_look(context, allowed, first, model) if self.first_looks else None
        if again is not None:
            notes = {
                "sampler": "second look",
                "completed_trials": str(completed),
                "second_look": f"stopped for want of boots, it still promises "
                f"{math.expm1(again[1]) * 100:+.1f}% (E[max(0, gain)]); its earlier boots count",
            }
            return self._proposal(context, again[0], completed, notes, read)
        later = (
            further_look(context, allowed, model) if self.first_looks and first is None else None
        )
        if later is not None:
            reopened_now = open_changes(context)
            untried = any(context.champion.apply(c).key not in reopened_now for c in allowed)
            promise = f"{math.expm1(later[1]) * 100:+.1f}% (E[max(0, gain)])"
            notes = {
                "sampler": "further look",
                "completed_trials": str(completed),
                "second_look": f"stopped for want of boots, it still promises {promise}, more "
                "than any change not yet looked at; its earlier boots count"
                if untried
                else "nothing is left untried under this champion, and its boots did not "
                f"settle it: it still promises {promise}; its earlier boots count",
            }
            return self._proposal(context, later[0], completed, notes, read)
        # a change open for another look is taken on what it promises (above), not TPE's
        reopened = set(open_changes(context)) if self.first_looks else set()
        fresh = [c for c in allowed if context.champion.apply(c).key not in reopened]
        if not fresh:  # only open changes are left: TPE may take one
            reopened, fresh = set(), list(allowed)
        allowed = fresh
        if first is not None and model is not None and first[0] == model.knob:
            # the draft knob's looks in the model's order, best predicted first
            change = model.best_of(looks)
            notes = {
                "sampler": "draft model",
                "completed_trials": str(completed),
                "first_look": _first_look_note(context, first[0]),
                "draft_model": model.describe(int(change.new)),
            }
            return self._proposal(context, change, completed, notes, read, model)
        for asks in range(1, MAX_ASKS + 1):
            asked = as_params(context.space, study.ask(dists).params)
            if asked is None:  # unreachable: TPE samples inside the distributions
                continue
            moved = self._moved(context, asked, sampler_seed)
            for knob in moved:
                change = Change(knob=knob, old=context.champion[knob], new=asked[knob])
                if first is not None and not any(
                    c.knob == knob and same_value(c.new, change.new) for c in looks
                ):
                    continue
                if (
                    context.refusal(change) is None
                    and context.champion.apply(change).key not in reopened
                ):
                    notes = {
                        "sampler": "tpe" if completed >= self.n_startup else "random (startup)",
                        "completed_trials": str(completed),
                        "asks": str(asks),
                    }
                    others = [f"{k}={as_text(asked[k])}" for k in moved if k != knob]
                    if others:
                        notes["tpe_also_moved"] = ", ".join(others)
                    if first is not None:
                        notes["first_look"] = _first_look_note(context, first[0])
                    return self._proposal(context, change, completed, notes, read)
        if first is not None:
            return self._fallback(context, looks, sampler_seed, completed, read, first[0])
        return self._fallback(context, allowed, sampler_seed, completed, read)

    # ---- the study -----------------------------------------------------------------------------
    def study(
        self, context: ProposalContext, dists: dict[str, BaseDistribution]
    ) -> tuple[optuna.Study, History]:
        """The context's history as this proposer's study (``agents.tpe_study.study_of``),
        its sampler seeded as ``propose``'s."""
        seed = seed_for(self.seed, context.seed, len(context.history))
        return study_of(
            context, dists, seed=seed, n_startup=self.n_startup, direction=self.direction
        )

    # ---- which knob ----------------------------------------------------------------------------
    def _moved(
        self, context: ProposalContext, asked: Mapping[str, Value], sampler_seed: int
    ) -> list[str]:
        """The knobs where ``asked`` differs from the champion, best first (see the class)."""
        ranked: list[tuple[float, float, int, str]] = []
        for spec in context.space.knobs:
            old = context.champion[spec.name]
            new = asked[spec.name]
            if same_value(new, old):
                continue
            effects = [
                abs(e.delta_pct)
                for e in context.history
                if e.knob == spec.name and e.measured and e.delta_pct is not None
            ]
            explored = context.tries(spec.name) / (1.0 + math.sqrt(max(effects, default=0.0)))
            tie = seed_for(sampler_seed, spec.name)
            ranked.append((explored, -_move(spec, old, new), tie, spec.name))
        return [name for *_, name in sorted(ranked)]

    def _fallback(
        self,
        context: ProposalContext,
        allowed: Sequence[Change],
        sampler_seed: int,
        completed: int,
        read: History,
        first: str | None = None,
    ) -> Proposal:

        def rank(change: Change) -> tuple[int, int, int]:
            tie = seed_for(sampler_seed, change.knob, as_text(change.new))
            return (context.tries(change.knob), context.tries(change.knob, change.new), tie)

        notes = {
            "sampler": "fallback",
            "completed_trials": str(completed),
            "asks": str(MAX_ASKS),
            "fallback": f"TPE's {MAX_ASKS} suggestions gave no allowed change; "
            f"took the least-tried of {len(allowed)} allowed neighbours",
        }
        if first is not None:
            notes["first_look"] = _first_look_note(context, first)
        return self._proposal(context, min(allowed, key=rank), completed, notes, read)

    # ---- the words -----------------------------------------------------------------------------
    def _proposal(
        self,
        context: ProposalContext,
        change: Change,
        completed: int,
        notes: dict[str, str],
        read: History,
        model: DraftPrediction | None = None,
    ) -> Proposal:
        """The proposal of ``change``, in words; ``model``: the draft-length model that chose
        it, whose prediction is both the hypothesis's reason and the expected effect."""
        spec = context.space.spec(change.knob)
        target = f"{change.knob}={as_text(change.new)}"
        if notes["sampler"] == "draft model":
            how = notes["draft_model"]
        elif notes["sampler"] in ("second look", "further look"):
            how = f"a second look at {target}: {notes['second_look']}"
        elif notes["sampler"] == "fallback" and "first_look" in notes:
            how = f"TPE's suggestions did not move it; {target} is its least-tried allowed value"
        elif notes["sampler"] == "fallback":
            how = f"TPE kept suggesting decided or refused configs; {target} is least explored"
        elif notes["sampler"] == "tpe":
            how = f"TPE over {completed} completed trials puts {target} in the promising region"
            failed = sum(
                1
                for e in context.history
                if infeasible(e) and as_params(context.space, e.config) is not None
            )
            if failed:
                notes["infeasible_trials"] = str(failed)
                how += f" (away from the {failed} config(s) that failed on their own)"
        else:
            how = (
                f"exploring: {completed} completed trial(s) of the {self.n_startup} TPE needs "
                f"before it models the surface, so {target} is a random draw"
            )
        evidence = _evidence(context.history, spec, change.new)
        if "first_look" in notes:
            how = f"a first look ({notes['first_look']}); {how}"
        hypothesis = f"{change.describe()}: {how}."
        if evidence:
            hypothesis += " Nearest evidence: " + "; ".join(_line(e, spec) for e in evidence) + "."
        notes.update(read.notes())
        return Proposal(
            change=change,
            source=self.name,
            hypothesis=hypothesis,
            expected_effect=_expected(evidence, change, spec, self.direction)
            if model is None
            else model.expected(int(change.new), self.direction),
            risk=context.risk_of(change),
            estimated_cost=ONE_EXPERIMENT,
            notes=notes,
        )


def _first_look_note(context: ProposalContext, knob: str) -> str:
    return f"{knob} has values not yet tried under this champion: {why(context, knob)}"


def _evidence(history: Sequence[HistoryEntry], spec: KnobSpec, value: Value) -> list[HistoryEntry]:
    """Up to three measured entries at ``value`` (changes of this knob first), else the changes
    of this knob nearest ``value`` (numeric knobs only)."""
    measured = [e for e in history if e.measured and spec.name in e.config]
    exact = [e for e in measured if same_value(e.config[spec.name], value)]
    changed_here = [e for e in exact if e.knob == spec.name]
    if exact:
        return (changed_here or exact)[-3:]
    if spec.type not in ("int", "float") or isinstance(value, bool | str):
        return []
    moved = [e for e in measured if e.knob == spec.name and isinstance(e.value, int | float)]

    def distance(e: HistoryEntry) -> tuple[float, int]:
        assert isinstance(e.value, int | float)
        return (abs(float(e.value) - float(value)), -e.experiment)

    return sorted(moved, key=distance)[:3]


def _line(entry: HistoryEntry, spec: KnobSpec) -> str:
    if entry.knob == spec.name:
        return entry.describe()
    return f"{entry.describe()} (with {spec.name}={as_text(entry.config[spec.name])})"


def _expected(
    evidence: Sequence[HistoryEntry], change: Change, spec: KnobSpec, direction: Direction
) -> str:
    deltas = [e.delta_pct for e in evidence if e.delta_pct is not None]
    if not deltas:
        return (
            f"unknown: nothing measured near {spec.name}={as_text(change.new)} yet; "
            "a first look at this region"
        )
    mean = sum(deltas) / len(deltas)
    word = versus(mean, direction)
    if word.startswith("worse"):
        word += " so far, though TPE still ranks the region high"
    exact = any(same_value(e.config.get(spec.name), change.new) for e in evidence)
    where = "at this value" if exact else "at the nearest measured values"
    return (
        f"{word}: objective {mean:+.1f}% on average over {len(deltas)} measurement(s) {where}, "
        "each against the champion of its time"
    )


def _move(spec: KnobSpec, old: Value, new: Value) -> float:
    if spec.type in ("int", "float") and isinstance(new, int | float):
        assert spec.low is not None and spec.high is not None
        span = spec.high - spec.low
        return abs(float(new) - float(old)) / span if span else 0.0
    return 1.0
