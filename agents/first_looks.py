"""First looks: which knob the Optuna proposer changes before TPE's preferences take over.

TPE models only the configs it has seen, so it may never move a knob its history never moved
(CUDA graphs left off for a whole run, K never tried below 4, a memory knob the card called
flat). So under the first champion every knob gets a look, and under a later one the knobs
that may have moved with the keep get looks again:

- a knob the prior in force says matters (``context.prior``: its spec's, or what this
  cluster's measurements taught, ``p_null`` below ``FIRST_LOOK_NULL``) gets a look at every
  value under each champion when it has at most ``FIRST_LOOK_VALUES`` (a sweep of K; CUDA
  graphs' one other value), one look when it has more;
- any other knob gets one look under the first champion, and one under a later champion when
  it interacts with the knob the last keep changed (declared: ``interacts_with`` on either
  knob's spec; learned: ``context.interacting``, a change that measured differently under two
  champions): the values decided under the old champion are open again, and a look keeps
  them from waiting on TPE;
- a knob that has had no look at all (a keep came before its turn under the first champion,
  or the profile gained it) gets one under whichever champion is in force: its turn is not
  lost because another knob's keep came first;
- a knob whose one look under this champion went too far (an ordered knob, discarded as
  worse than the champion or past a guardrail: ``HistoryEntry.overshot``) gets one more, a
  step back: the value halfway between the champion's and the one looked at (``step_back``;
  16 slots → 4 broke time to first token, so 8 is looked at). Compass search shrinks a step
  that failed the same way; a far value's failure says nothing about a nearer one. The look
  showed that the knob does something under this champion, so the step back promises as a
  knob with no null (``p_null`` 0 in ``expected_gain``): it is not left behind knobs whose
  prior says most of their changes do nothing;
- the knob looked at first is the one whose best look promises the most gain per boot:
  ``E[gain] = (1 − p_null) · E[max(0, δ)]``, with ``δ ~ N(0, τ²)`` (``τ`` the prior's spread:
  ``E = τ/√(2π)``) or, for the draft knob where the draft-length model predicts a value,
  ``δ ~ N(prediction, (τ/2)²)``; per boot: divided by the boots a decision costs when a share
  of the knob's changes fail to boot (``1 / (1 − crashes / (tries + 1))``).

A change the verdict stopped for want of boots while it still promised a gain is open for a
second look (``second_look``, below): it competes with the first looks on what it promises,
from its posterior rather than a prior, and is never a first look again.

Going back to the champion this one replaced is no look (that comparison was just decided);
a knob whose changes failed to boot ``FIRST_LOOK_CRASHES`` times with one failure class (the
config's: a node unreachable says nothing about the knob) gets no more (every K but 7 wedges
one stack's boot); a draft-knob value the model predicts more
than ``DRAFT_LOOK_FLOOR`` % worse than the champion gets none (TPE may still try it).
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from collections.abc import Callable, Sequence

from agents.context import HistoryEntry, ProposalContext, same_value
from agents.draft_model import DraftPrediction
from knobs.config import Change, Config
from knobs.spec import EffectPrior, KnobSpec, Value, as_text
from knobs.vocabulary import INFRASTRUCTURE, Status

#: A knob whose prior in force says fewer than this share of its changes do nothing is swept
#: under every champion (every value, when it has at most ``FIRST_LOOK_VALUES``).
FIRST_LOOK_NULL = 0.5
#: A knob known to matter with at most this many values gets a first look at every value
#: under each champion (a sweep: K from 1 to 7); a larger one gets one look.
FIRST_LOOK_VALUES = 8
#: A value of the draft knob that the draft-length model predicts this much worse than the
#: champion (percent) gets no first look (TPE may still try it later).
DRAFT_LOOK_FLOOR = 10.0
#: A knob whose changes failed to boot this many times with one failure class (under any
#: champion) gets no more first looks.
FIRST_LOOK_CRASHES = 2
#: The prior of a knob that declares none and has learned nothing (the profile's default).
_FLAT = EffectPrior(p_null=0.5, effect_pct=15.0)


def seed_for(*parts: object) -> int:
    """A 32-bit seed from ``parts`` (stable across processes, unlike ``hash`` of a string)."""
    text = "\x1f".join(str(p) for p in parts)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "big")


def _prior(context: ProposalContext, knob: str) -> EffectPrior:
    return context.prior(knob) or _FLAT


def expected_gain(context: ProposalContext, change: Change, model: DraftPrediction | None) -> float:
    """``E[max(0, δ)]`` of ``change`` (log scale) under its knob's prior (see the module); a
    step back counts its knob as one that does something (its look went too far)."""
    prior = _prior(context, change.knob)
    back = step_back(context).get(change.knob)
    if back is not None and same_value(change.new, back[1]):
        prior = prior.model_copy(update={"p_null": 0.0})
    tau = math.log1p(prior.effect_pct / 100)
    predicted = (
        model.change_pct.get(int(change.new))
        if model is not None and change.knob == model.knob
        else None
    )
    if predicted is None:
        return (1 - prior.p_null) * tau / math.sqrt(2 * math.pi)
    mean, sd = math.log1p(max(predicted, -99.0) / 100), tau / 2
    z = mean / sd
    normal = math.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)
    return (1 - prior.p_null) * (sd * normal + mean * 0.5 * (1 + math.erf(z / math.sqrt(2))))


def per_boot(
    context: ProposalContext, changes: Sequence[Change], model: DraftPrediction | None
) -> float:
    """What the best of ``changes`` promises per boot: ``expected_gain`` over the boots a
    decision of its knob costs (``boots_per_decision``); 0 for no change."""
    return max(
        (expected_gain(context, c, model) / boots_per_decision(context, c.knob) for c in changes),
        default=0.0,
    )


def boots_per_decision(context: ProposalContext, knob: str) -> float:
    """The boots a decided change of ``knob`` costs when some of its changes fail to boot."""
    crashes = sum(1 for e in config_crashes(context) if e.knob == knob)
    return 1.0 / (1.0 - crashes / (context.tries(knob) + 1))


def config_crashes(context: ProposalContext) -> list[HistoryEntry]:
    """The changes that failed to boot for the config's reasons: not those a ledger of an older
    release decided as a crash for the infrastructure's (a node unreachable, stuck clocks),
    which say nothing about the knob."""
    return [
        e
        for e in context.history
        if e.status == Status.CRASH and e.knob and e.failure_class not in INFRASTRUCTURE
    ]


def _sweeps(context: ProposalContext, spec: KnobSpec) -> bool:
    """Whether every value of ``spec`` gets a look under each champion (see the module)."""
    prior = _prior(context, spec.name)
    return prior.p_null < FIRST_LOOK_NULL and len(spec.domain()) <= FIRST_LOOK_VALUES


def why(context: ProposalContext, knob: str) -> str:
    """Why ``knob`` gets a look under this champion, in words."""
    prior = _prior(context, knob)
    back = step_back(context).get(knob)
    if back is not None and not _sweeps(context, context.space.spec(knob)):
        return (
            f"its look at {as_text(back[0])} went too far (worse, or past a guardrail): "
            f"a step back to {as_text(back[1])}"
        )
    if prior.p_null < FIRST_LOOK_NULL:
        return f"only {prior.p_null:.0%} of its changes do nothing"
    kept = _last_kept(context)
    if kept is None:
        return "every knob gets a look under the first champion"
    if knob not in _looked_at(context):
        return "it has had no look yet"
    return f"it may interact with {kept}, which the last keep changed"


def _looked_at(context: ProposalContext) -> set[str]:
    """The knobs some decided experiment changed (a vetoed proposal is no look)."""
    return {e.knob for e in context.history if e.knob and e.status != Status.VETOED}


def step_back(context: ProposalContext) -> dict[str, tuple[Value, Value]]:
    """The ordered knobs whose one look under this champion went too far, each with the
    value looked at and the value halfway back to the champion's (nearer the champion when
    halfway falls between two; none when the look was one step away)."""
    looks: dict[str, list[HistoryEntry]] = {}
    for e in context.history:
        if (
            e.champion_key == context.champion.key
            and e.knob
            and e.status != Status.VETOED
            and e.coupled_knob is None  # a coupled move is no look at one knob's values
        ):
            looks.setdefault(e.knob, []).append(e)
    specs = {s.name: s for s in context.space.knobs}
    out: dict[str, tuple[Value, Value]] = {}
    for knob, entries in looks.items():
        spec = specs.get(knob)
        if spec is None or not spec.ordered or len(entries) != 1 or not entries[0].overshot:
            continue
        looked = entries[0].value
        domain = [float(v) for v in spec.domain()]
        if not isinstance(looked, int | float) or isinstance(looked, bool):
            continue
        here = _nearest(domain, float(context.champion[knob]))
        there = _nearest(domain, float(looked))
        back = here + int((there - here) / 2)  # truncated: toward the champion
        if back != here:
            out[knob] = (looked, spec.domain()[back])
    return out


def _nearest(domain: Sequence[float], value: float) -> int:
    return min(range(len(domain)), key=lambda i: abs(domain[i] - value))


def eligible(context: ProposalContext) -> dict[str, bool]:
    """The knobs that get looks under this champion, each with whether every value does."""
    here = {e.knob for e in context.history if e.champion_key == context.champion.key}
    crashes = Counter((e.knob, e.failure_class) for e in config_crashes(context))
    kept = _last_kept(context)
    moved = set() if kept is None else _interacting(context, kept)
    looked = _looked_at(context)
    stepped = step_back(context)
    out: dict[str, bool] = {}
    for spec in context.space.knobs:
        if any(n >= FIRST_LOOK_CRASHES for (k, _), n in crashes.items() if k == spec.name):
            continue  # its changes keep failing to boot the same way: left to TPE
        sweep = _sweeps(context, spec)
        if not sweep and spec.name in here:
            if spec.name in stepped:
                out[spec.name] = False  # a step back from a look that went too far
            continue  # one look under each champion
        if sweep or kept is None or spec.name in moved or spec.name not in looked:
            out[spec.name] = sweep
    return out


def _last_kept(context: ProposalContext) -> str | None:
    """The knob the keep that made this champion changed (``None``: the first champion)."""
    for e in reversed(context.history):
        if e.status == Status.KEEP and e.knob and Config(e.config).key == context.champion.key:
            return e.knob
    return None


def _interacting(context: ProposalContext, kept: str) -> set[str]:
    """The knobs that may have moved with a keep of ``kept``."""
    declared = set(context.space.spec(kept).interacts_with) | {
        s.name for s in context.space.knobs if kept in s.interacts_with
    }
    return (declared | set(context.interacting)) - {kept}


def first_look(
    context: ProposalContext,
    allowed: Sequence[Change],
    seed: int,
    model: DraftPrediction | None = None,
) -> tuple[str, list[Change]] | None:
    """The knob to look at now and its changes that are looks, or ``None`` when none is left
    (see the module)."""
    knobs = eligible(context)
    back = {
        e.champion_key
        for e in context.history
        if e.status == Status.KEEP and Config(e.config).key == context.champion.key
    }
    reopened = open_changes(context)  # looked at already: second looks, not first
    # a knob that is eligible for its step back alone looks at that value only
    stepped = {k: v[1] for k, v in step_back(context).items() if knobs.get(k) is False}
    looks = [
        c
        for c in allowed
        if c.knob in knobs
        and (c.knob not in stepped or same_value(c.new, stepped[c.knob]))
        and context.champion.apply(c).key not in back
        and context.champion.apply(c).key not in reopened
        and not (
            model is not None
            and c.knob == model.knob
            and model.change_pct.get(int(c.new), 0.0) < -DRAFT_LOOK_FLOOR
        )
    ]
    if not looks:
        return None

    def promise(knob: str) -> tuple[float, float, int, int]:
        mine = [c for c in looks if c.knob == knob]
        tie = seed_for(seed, knob)
        return (
            -per_boot(context, mine, model),
            _prior(context, knob).p_null,
            context.tries(knob),
            tie,
        )

    knob = min({c.knob for c in looks}, key=promise)
    return knob, [c for c in looks if c.knob == knob]


def open_changes(context: ProposalContext) -> dict[str, HistoryEntry]:
    """The configs open for another look under this champion (the verdict stopped them for
    want of boots: ``HistoryEntry.second_look``, ``HistoryEntry.further_look``), each with
    its latest look."""
    out: dict[str, HistoryEntry] = {}
    for e in context.history:
        if e.champion_key != context.champion.key or e.knob is None:
            continue
        if e.coupled_knob is not None:
            continue  # a coupled move gets one try under a champion (``agents.coupled``)
        key = Config(e.config).key
        if key in context.decided_keys:
            continue
        if e.second_look is None and e.further_look is None:
            out.pop(key, None)
        else:
            out[key] = e
    return out


def second_look(
    context: ProposalContext,
    allowed: Sequence[Change],
    first: tuple[str, list[Change]] | None,
    model: DraftPrediction | None = None,
) -> tuple[Change, float] | None:
    """The open change to look at again now, with what it promises, or ``None``: the one that
    promises most, when that is at least what the best first look promises per boot (evidence
    that a change is close to a keep weighs more than a prior's hope for an untried one)."""
    best = _most_promising(context, allowed, lambda e: e.second_look)
    if best is None or first is None:
        return best
    return best if best[1] >= per_boot(context, first[1], model) else None


def untried_promise(
    context: ProposalContext, allowed: Sequence[Change], model: DraftPrediction | None = None
) -> float:
    """What the proposer's next change not yet looked at under this champion promises per
    boot once the first looks are done: its pick is TPE's, made on no promise, so the
    average over the knobs left of what each knob's best untried change promises
    (``per_boot``, under its prior in force); 0 when every allowed change was looked at. A
    single value that promises much is no reason to pass over a measured change: TPE may
    never draw it."""
    reopened = open_changes(context)
    fresh = [c for c in allowed if context.champion.apply(c).key not in reopened]
    by_knob = [[c for c in fresh if c.knob == k] for k in {c.knob for c in fresh}]
    return sum(per_boot(context, mine, model) for mine in by_knob) / max(1, len(by_knob))


def further_look(
    context: ProposalContext, allowed: Sequence[Change], model: DraftPrediction | None = None
) -> tuple[Change, float] | None:
    """The change to look at once more now although its second looks are spent, with what it
    promises: the one whose posterior promises most, when that beats what the next change not
    yet looked at promises (``untried_promise``). Evidence and priors on one scale: late in a
    round, when the priors in force say what is left untried is likely nothing, the boots go
    to the change the measurements say may still gain."""
    best = _most_promising(context, allowed, lambda e: e.further_look)
    if best is None or best[1] <= untried_promise(context, allowed, model):
        return None
    return best


def _most_promising(
    context: ProposalContext,
    allowed: Sequence[Change],
    promise: Callable[[HistoryEntry], float | None],
) -> tuple[Change, float] | None:
    """The allowed change open for another look whose latest look promises most (``promise``
    of its history entry), with that promise."""
    promises = open_changes(context)
    best: tuple[Change, float] | None = None
    for c in allowed:
        entry = promises.get(context.champion.apply(c).key)
        gain = None if entry is None else promise(entry)
        if gain is not None and (best is None or gain > best[1]):
            best = (c, gain)
    return best
