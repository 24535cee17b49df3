"""Changes the profile can no longer run, closed without a boot.

A change of a knob the profile lost cannot run: its config fitted is the champion's. Nor can
one whose value (either value of a coupled move) the knob's domain no longer has: the profile
narrowed it since; nor one whose config is a combination the profile forbids since (a person
who saw it crash the engine wrote the rule before the resume). One a killed round left under
way (undecided, or a proposal not yet an experiment) is closed when the round takes it up
(``closure``, ``close``): decided ``vetoed`` by the profile, with the line, its boots kept and
no boot more; it bars nothing and is not taken as decided (should the knob, the value or the
combination come back, it may run) and does not count against the budget.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from knobs.config import Config
from knobs.errors import KnobError
from knobs.space import KnobSpace
from knobs.spec import Value, as_text
from ledger import ExperimentRecord, Ledger
from orchestrator import knob_renames
from orchestrator.evolution import fit
from orchestrator.undecided import close_undecided

#: Who closes a change the profile can no longer run (a pending proposal's decider, the
#: verdict's ``by``), and the verdict's rules: of a knob it lost, of a value outside a domain it
#: narrowed, of a combination it forbids since (``closure``). ``history`` bars nothing for them
#: and counts them as undecided.
CLOSED_BY = "profile"
LOST_RULE = "knob-removed"
DOMAIN_RULE = "outside-domain"
FORBIDDEN_RULE = "forbidden-combination"
#: ...and of a baseline left undecided whose config ``champion:`` no longer says
#: (``profile_champion.stale_baseline``)
CHAMPION_RULE = "champion-changed"
CLOSED_RULES = frozenset({LOST_RULE, DOMAIN_RULE, FORBIDDEN_RULE, CHAMPION_RULE})


class Closure(NamedTuple):
    """Why the profile closes a change under way without a boot (``closure``)."""

    #: the verdict's rule (``LOST_RULE``, ``DOMAIN_RULE`` or ``FORBIDDEN_RULE``)
    rule: str
    #: the knob the change moves that the profile no longer has, or no longer has the value of
    knob: str
    #: the verdict's reason: what, and that the change is closed and bars nothing
    reason: str
    #: what results.tsv's description adds after ``closed:``
    said: str
    #: the verdict's statistics beyond who closed it
    stats: dict[str, object]


def closure(
    space: KnobSpace,
    knob: str | None,
    value: Value | None,
    coupled: str | None = None,
    coupled_value: Value | None = None,
    config: Callable[[], Config] | None = None,
) -> Closure | None:
    """Why the profile of now closes a change that moves ``knob`` to ``value`` (and, a coupled
    move, its enabling knob ``coupled`` to ``coupled_value``) under way: a knob ``space`` no
    longer has (``LOST_RULE``), else a value outside the knob's domain now (``DOMAIN_RULE``:
    the profile narrowed it since), else, ``config`` given (the config the change runs, built
    only once the knobs and values fit), a combination the profile forbids now
    (``FORBIDDEN_RULE``). ``None``: the change may run (or moves none: the baseline)."""
    moves = [(k, v) for k, v in ((knob, value), (coupled, coupled_value)) if k is not None]
    for name, _ in moves:
        if name not in space.names:
            said = f"knob {name} is no longer in the profile"
            return Closure(LOST_RULE, name, f"{said}: {_CLOSED}", said, {"knob": name})
    for name, new in moves:
        if new is None:
            continue
        spec = space.spec(name)
        try:
            spec.parse(new)
        except KnobError:
            said = f"{name} {as_text(new)} is outside the profile's domain now"
            reason = f"{said} ({spec.describe_domain()}): {_CLOSED}"
            return Closure(DOMAIN_RULE, name, reason, said, {"knob": name, "value": new})
    if config is None or knob is None:
        return None
    try:
        space.check_constraints(config())
    except KnobError as e:
        said = f"the profile forbids its config now ({e.message})"
        return Closure(FORBIDDEN_RULE, knob, f"{said}: {_CLOSED}", said, {"knob": knob})
    return None


_CLOSED = "the change is closed without a verdict and not booted; nothing is barred"


def _closed_after(booted: int) -> str:
    """What a closure says of a change that booted ``booted`` times before it was closed (a
    kill as it booted): its boots kept, none more — never "not booted" beside its boots."""
    return (
        f"the change is closed without a verdict, its {booted} boot(s) kept and no boot more; "
        "nothing is barred"
    )


def closure_of(space: KnobSpace, ledger: Ledger, e: ExperimentRecord) -> Closure | None:
    """``closure`` of experiment ``e``'s change, its config fitted to ``space``.

    Raises:
        LedgerError: the ledger failed.
    """

    def config() -> Config:
        return fit(space, ledger, e).config

    e = knob_renames.experiment(space, e)  # a change of a knob renamed since is its own
    return closure(space, e.knob, e.value, e.coupled_knob, e.coupled_value, config)


def close(ledger: Ledger, e: ExperimentRecord, why: Closure) -> ExperimentRecord:
    """Decide change ``e``, undecided, that the profile closes (``why``): ``vetoed`` by the
    profile (the closure's rule; its statistics the boots it had and how they failed), its
    boots kept, results.tsv's description saying why. The decided experiment.

    Raises:
        LedgerError: the ledger failed, or ``e`` is decided already.
    """
    booted = len(ledger.boots(e.id))
    return close_undecided(
        ledger,
        e,
        rule=why.rule,
        reason=why.reason.replace(_CLOSED, _closed_after(booted)) if booted else why.reason,
        by=CLOSED_BY,
        description=f"{e.description}; closed: {why.said}",
        stats=why.stats,
    )
