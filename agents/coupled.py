"""Coupled moves: the one place where an experiment changes two knobs (issue #18, item 4).

A value that failed to boot for a reason another knob explains may be tried together with
the change that enables it, as one experiment. ``kv_cache_dtype=auto`` failing with
``kv_capacity`` at ``gpu_memory_utilization`` 0.85 is the case in point: the memory knob
declares ``kv_capacity`` monotone (``below``: a larger fraction leaves more KV cache), so
``kv_cache_dtype fp8_e4m3 → auto + gpu_memory_utilization 0.85 → 0.86`` is proposed as one
move, where no one-knob step reaches it (``auto`` alone is barred at 0.85, and 0.86 alone
changes nothing the verdict can see).

A coupled move ``a=v`` with ``b=w`` is open under the champion when:

- a decided experiment changed ``a`` alone to ``v`` and crashed with failure class ``F``;
- ``a=v`` is barred now under this champion (else a one-knob change may simply run it);
- another knob ``b`` declares ``F`` in its ``monotone_failures`` (``below``: larger values
  cure it; ``above``: smaller ones);
- ``w`` is the first value of ``b``'s domain from the champion's in the curing direction
  whose config with ``a=v`` lies in no known-bad region (the region ``a=v``'s crash bars is
  left at the next step); the scan stops where ``b=w`` alone is barred (an OOM above) or the
  pair was decided, and the pair must break no hard constraint;
- no coupled move of ``a=v`` with ``b`` was decided under this champion: one try per value
  and failure class. A coupled move that fails again bars the pair's region
  (``orchestrator.history.crash_region``), not ``a=v`` alone.

Nothing else changes two knobs: ``ProposalContext.refusal`` refuses any other two-knob change.
The verdict judges a coupled move with the effect prior of the knob whose value failed
(``a``), and a keep moves both knobs in the champion.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from knobs.config import Change, Config
from knobs.errors import KnobError
from knobs.spec import Value, as_text
from knobs.vocabulary import INFRASTRUCTURE, Status

if TYPE_CHECKING:
    from agents.context import HistoryEntry, ProposalContext


#: The note of a coupled move's proposal that says which failure it answers
#: (``CoupledMove.why``): the veto prompt and the MLflow run show it.
COUPLED_NOTE = "coupled"


@dataclass(frozen=True)
class CoupledMove:
    """An open coupled move: the two-knob change, and the crash whose cause it answers."""

    change: Change
    #: The decided experiment in which ``change.knob`` at ``change.new`` failed to boot.
    experiment: int
    #: Its failure class, which the enabling knob declares monotone.
    failure_class: str

    def why(self) -> str:
        """Which failure the move answers, in words (for the hypothesis and the veto prompt)."""
        change = self.change
        assert change.enabling is not None
        b = change.enabling
        return (
            f"{change.knob}={as_text(change.new)} failed to boot with {self.failure_class} in "
            f"experiment #{self.experiment}, a failure {b.knob} declares monotone; "
            f"{b.knob} {as_text(b.old)} → {as_text(b.new)} is the next value that may cure it"
        )


def _same(a: object, b: object) -> bool:
    # as ``context.same_value``: True is not 1 here
    return a == b and isinstance(a, bool) == isinstance(b, bool)


def tried(context: ProposalContext) -> set[tuple[str, str, str]]:
    """``(a, value of a, b)`` of every coupled move decided under this champion."""
    return {
        (e.knob, as_text(e.value), e.coupled_knob)
        for e in context.history
        if e.champion_key == context.champion.key
        and e.knob is not None
        and e.value is not None
        and e.coupled_knob is not None
    }


def open_moves(context: ProposalContext) -> list[CoupledMove]:
    """The coupled moves open under this champion, oldest failure first (see the module).
    Never raises."""
    out: list[CoupledMove] = []
    done = tried(context)
    seen: set[tuple[str, str, str]] = set()
    for e in context.history:
        cause = _cause(context, e)
        if cause is None:
            continue
        a, v, failure = cause
        for spec in context.space.knobs:
            side = spec.monotone_failures.get(failure)
            key = (a, as_text(v), spec.name)
            if side is None or spec.name == a or key in done or key in seen:
                continue
            move = _enabling(context, a, v, spec.name, side)
            if move is not None:
                seen.add(key)
                out.append(CoupledMove(move, e.experiment, failure))
    return out


def _cause(context: ProposalContext, e: HistoryEntry) -> tuple[str, Value, str] | None:
    """``(a, v, F)`` when ``e`` is a one-knob crash of ``a=v`` with class ``F`` that bars
    ``a=v`` under this champion; else None."""
    if (
        e.status != Status.CRASH
        or e.knob is None
        or e.value is None
        or e.coupled_knob is not None
        or not e.failure_class
        or e.failure_class in INFRASTRUCTURE
        or e.knob not in context.space.names
    ):
        return None
    a, v = e.knob, e.value
    try:
        value = context.space.spec(a).parse(v)
    except KnobError:
        return None
    if _same(context.champion[a], value):
        return None
    alone = Config({**context.champion.as_dict(), a: value})
    if not any(r.matches(alone) for r in context.known_bad):
        return None  # not barred now: a one-knob change may run it
    return a, value, e.failure_class


def _enabling(context: ProposalContext, a: str, v: Value, b: str, side: str) -> Change | None:
    """``a=v`` with the first value of ``b`` in the curing direction that leaves every
    known-bad region, or None (see the module)."""
    spec = context.space.spec(b)
    held = context.champion[b]
    if isinstance(held, bool) or not isinstance(held, int | float):
        return None
    numbers = [x for x in spec.domain() if isinstance(x, int | float) and not isinstance(x, bool)]
    # ``below``: the failure holds at and below a value, so larger values may cure it
    path = (
        sorted(x for x in numbers if x > held)
        if side == "below"
        else sorted((x for x in numbers if x < held), reverse=True)
    )
    base = context.champion.as_dict()
    for w in path:
        alone = Config({**base, b: w})
        if any(r.matches(alone) for r in context.known_bad):
            return None  # b itself is barred here, and (monotone) beyond
        try:
            change = context.space.coupled_change(context.champion, a, v, b, w)
        except KnobError:
            continue  # a hard constraint: the next value may not have it
        pair = context.champion.apply(change)
        if pair.key in context.decided_keys:
            return None
        if any(r.matches(pair) for r in context.known_bad):
            continue  # still inside a=v's barred region: one step further
        return change
    return None


def refusal_reason(context: ProposalContext, change: Change) -> str | None:
    """``None`` if the coupled ``change`` is an open coupled move now, else why not."""
    for move in open_moves(context):
        m = move.change
        assert m.enabling is not None and change.enabling is not None
        if (
            m.knob == change.knob
            and _same(m.new, change.new)
            and m.enabling.knob == change.enabling.knob
            and _same(m.enabling.new, change.enabling.new)
        ):
            return None
    return (
        f"{change.describe()} is not an open coupled move: two knobs change together only "
        "where a value failed to boot for a reason the other knob declares (monotone_failures), "
        "at the next value of that knob, once under a champion"
    )
