"""What a proposer sees: the ledger's history as a ``ProposalContext``.

Every decided experiment of the cluster becomes a history entry; crashes, invalid outputs and
a person's vetoes become known-bad regions (with the person's words for a veto), held under
every later champion until a person clears them; the configs decided under the current
champion are not proposed again. A veto of the queue's timeout is no one's judgement: it bars
no region, and holds only for the rest of the sitting that vetoed it (``unjudged``); so does a
change left undecided on readings a busy host disturbed every one of (``busy_host.held``). A
failure of the infrastructure's (stuck clocks, a node unreachable: ``INFRASTRUCTURE``) is
never the config's: such an experiment bars nothing and may run again (a ledger from before
such failures stopped the round has them). A region a person cleared (``orchestrate known-bad
clear``, an event in the ledger) bars nothing either, and its config may run again; the
verdict that barred it stays as it was. When every one-knob change of the champion is decided
or barred, the changes the verdict stopped for want of boots or found not worth a change that
still promise a gain are open again (``policy.last_look``): the budget left goes to them
before a round ends with nothing to try.
"""

from __future__ import annotations

from agents import (
    HistoryEntry,
    KnownBad,
    KnownBadSource,
    ProposalContext,
    api_failures,
    round_spend,
)
from knobs.config import Config
from knobs.space import Reconciled
from knobs.spec import Value, clipped
from knobs.vocabulary import INFRASTRUCTURE, UNMEASURED, EventKind, State, Status
from ledger import EventRecord, ExperimentRecord, Ledger, RoundRecord
from orchestrator import budget, knob_renames, policy
from orchestrator.busy_host import held
from orchestrator.champion import ChampionEvidence
from orchestrator.errors import UsageError
from orchestrator.evolution import Lineage, fit
from orchestrator.priors import interacting, knob_priors, measured
from orchestrator.profile import Profile
from orchestrator.stalled_verdicts import busy_decided, guardrail_stalled
from orchestrator.step_cost import learned
from orchestrator.unjudged import closed, sitting_start, this_sitting, timed_out, unjudged

#: What a decided status bars, as a known-bad region's source.
_BARS: dict[Status, KnownBadSource] = {
    Status.CRASH: "crash",
    Status.INVALID: "invalid",
    Status.VETOED: "veto",
}


def proposal_context(
    profile: Profile,
    ledger: Ledger,
    champion: ChampionEvidence,
    rnd: RoundRecord,
    candidates_done: int,
) -> ProposalContext:
    """What the proposer sees now, built from the ledger."""
    current = champion.current()
    history: list[HistoryEntry] = []
    known_bad: list[KnownBad] = []
    decided = {current.config.key}
    looks: dict[str, int] = {}  # experiments of each config under this champion
    reopened: dict[str, bool] = {}
    lasts: dict[str, tuple[int, float | None]] = {}  # each config's latest look: its last look
    # each change under its knob's name now (a knob renamed: ``knob_renames``)
    experiments = knob_renames.experiments(profile.space, ledger, cluster=profile.cluster.name)
    # configs recorded under an earlier profile, fitted to this one, and the champions they
    # were decided against likewise (``evolution``): a change decided before a knob was added
    # (or while it was out of the profile) is still decided after, under the same champion
    lineage = Lineage.read(profile.space, ledger, profile.cluster.name, experiments)
    cleared = cleared_regions(ledger, profile.cluster.name)
    sitting = sitting_start(ledger, rnd)
    busy = busy_decided(ledger, ((e, ledger.verdict(e.id)) for e in experiments))
    for e in experiments:
        if e.state != State.DECIDED or e.status is None:
            continue
        fitted = lineage.fit(e)
        champion_key = lineage.champion_key(e)
        # left undecided on a busy host's readings alone (``busy_host.held``), or decided by an
        # earlier release on a busy host's windows (``stalled_verdicts``): it measured the
        # host, and nobody judged the value
        unread = held(ledger, e, profile.cells)
        judged = not unjudged(ledger, e) and e.id not in busy and not unread
        # vetoed by the queue's timeout, or left undecided by a busy host: held for the rest of
        # this sitting only, so the proposer does not offer it again at once
        holding = (timed_out(ledger, e) or unread) and this_sitting(e, rnd, sitting)
        here = champion_key == current.config.key and (judged or holding)
        if here and judged:  # one a busy host left undecided is held, but no look at the value
            looks[fitted.config.key] = looks.get(fitted.config.key, 0) + 1
        again, further, last, overshot = (
            _read_verdict(profile, ledger, e, looks.get(fitted.config.key, 0))
            if here and not unread
            else (None, None, None, False)
        )
        entry = _entry(e, fitted, champion_key, again, overshot, further)
        history.append(entry if judged else entry.model_copy(update={"judged": False}))
        if e.id in cleared:  # a person cleared its region: it bars nothing, and may run again
            continue
        # a failure of the infrastructure's (stuck clocks, a node unreachable) measured the
        # node, not the config: it may run again; a change stopped for want of boots that still
        # promises a gain may be looked at again (``policy.second_look``)
        if here:
            decided.add(fitted.config.key)
            # the last look decides
            reopened[fitted.config.key] = again is not None or further is not None
            lasts[fitted.config.key] = (len(history) - 1, last)
        region = _barred(profile, ledger, e.model_copy(update={"config": fitted.config}))
        if region is not None and holds(region, champion_key, current.config.key):
            known_bad.append(region)
    changes = measured(
        ledger, experiments, profile.cells
    )  # the knobs' measured effects, for their priors
    # the step cost the verdict subtracts from a K change's counters: the draft-length model
    # predicts with the same (``step_cost``)
    step = learned(ledger, profile.space, experiments)
    context = ProposalContext(
        space=profile.space,
        champion=current.config,
        champion_objective=current.objective,
        history=tuple(history),
        known_bad=tuple(known_bad),
        decided_keys=frozenset(k for k in decided if not reopened.get(k, False)),
        budget_left=max(0, rnd.budget - candidates_done),
        seed=rnd.seed,
        # LLM spend so far in this round, from the ledger: a resumed round keeps its cap
        llm_spend_usd=round_spend(p.llm for p in ledger.proposals(round_id=rnd.id)),
        # the LLM API's failures since it last answered: a new process keeps its cool-off
        api_failures=api_failures(
            (p.created_at, p.llm) for p in ledger.proposals(cluster=profile.cluster.name)
        ),
        champion_cells=champion.cells(),
        knob_priors=knob_priors(profile, changes),
        interacting=interacting(changes),
        step_cost=None if step is None else step.belief(),
    )
    return _last_looks(context, lasts) if not context.candidates() else context


def proposal_context_of(profile: Profile, ledger: Ledger, round_id: int) -> ProposalContext:
    """What the proposer of round ``round_id`` sees now (``proposal_context``), for a command
    that decides one of its proposals from another terminal (``proposals approve --value``)."""
    rnd = ledger.round(round_id)
    done = budget.done(ledger.experiments(round_id=rnd.id))
    champion = ChampionEvidence(profile, ledger)
    if champion.fitted() is None:
        raise UsageError(
            f"cluster {profile.cluster.name} has no champion yet to check an edited value "
            "against: approve the proposal as proposed, or veto it"
        )
    return proposal_context(profile, ledger, champion, rnd, done)


def _last_looks(
    context: ProposalContext, lasts: dict[str, tuple[int, float | None]]
) -> ProposalContext:
    """``context`` with nothing left untried under its champion: the decided changes whose
    latest look still promises a gain (``policy.last_look``) open again, each as a further
    look with that promise (the proposer takes the most promising); unchanged when there are
    none, and the round ends."""
    history = list(context.history)
    opened: set[str] = set()
    for key, (index, promise) in lasts.items():
        entry = history[index]
        # a coupled move gets one try under a champion (``agents.coupled``)
        if promise is not None and key in context.decided_keys and entry.coupled_knob is None:
            history[index] = entry.model_copy(update={"further_look": promise})
            opened.add(key)
    if not opened:
        return context
    return context.model_copy(
        update={"history": tuple(history), "decided_keys": context.decided_keys - opened}
    )


def _read_verdict(
    profile: Profile, ledger: Ledger, e: ExperimentRecord, looks: int
) -> tuple[float | None, float | None, float | None, bool]:
    """What a discarded or inconclusive change's verdict in the ledger leaves the proposer:
    ``policy.second_look``, else what a further look promises (``policy.look_promise``), what
    a look promises once nothing is left untried (``policy.last_look``), and
    ``policy.overshot``."""
    if e.status not in (Status.DISCARD, Status.INCONCLUSIVE) or e.knob is None:
        return None, None, None, False
    verdict = ledger.verdict(e.id)
    if verdict is None:
        return None, None, None, False
    again = policy.second_look(profile.verdict, verdict.rule, verdict.stats, looks)
    further = (
        None
        if again is not None
        else policy.look_promise(profile.verdict, verdict.rule, verdict.stats)
    )
    last = policy.last_look(profile.verdict, verdict.rule, verdict.stats, looks)
    overshot = e.status == Status.DISCARD and policy.overshot(verdict.rule, verdict.stats)
    return again, further, last, overshot


def _entry(
    e: ExperimentRecord,
    fitted: Reconciled,
    champion_key: str,
    second_look: float | None = None,
    overshot: bool = False,
    further_look: float | None = None,
) -> HistoryEntry:
    """``e`` as history, its config fitted to the profile; but a change of a knob the profile
    lost keeps its config as recorded: fitted, it would read as the champion measured again
    (a model that learns from configs skips it, as it no longer fits the space)."""
    assert e.status is not None
    lost = e.knob is not None and e.knob in fitted.removed
    return HistoryEntry(
        experiment=e.id,
        config=(e.config if lost else fitted.config).as_dict(),
        knob=e.knob,
        value=e.value,
        coupled_knob=e.coupled_knob,
        coupled_value=e.coupled_value,
        status=e.status,
        objective=e.objective if e.status not in UNMEASURED else None,
        delta_pct=e.delta_pct,
        champion_key=champion_key,
        failure_class=e.failure_class,
        second_look=second_look,
        further_look=further_look,
        overshot=overshot,
    )


def cleared_regions(ledger: Ledger, cluster: str) -> dict[int, EventRecord]:
    """The experiments whose known-bad region a person cleared, each with the event that
    cleared it (``EventKind.KNOWN_BAD_CLEARED``, subject: the experiment's id)."""
    return {
        int(ev.subject): ev
        for ev in ledger.events(cluster, EventKind.KNOWN_BAD_CLEARED)
        if ev.subject.isdigit()
    }


def region_of(
    profile: Profile, ledger: Ledger, e: ExperimentRecord, lineage: Lineage | None = None
) -> KnownBad | None:
    """The region decided experiment ``e`` bars (its config fitted to the profile: by
    ``lineage``, the cluster's, when given), cleared or not; ``None`` when it bars none."""
    if e.state != State.DECIDED or e.status is None:
        return None
    fitted = fit(profile.space, ledger, e) if lineage is None else lineage.fit(e)
    return _barred(profile, ledger, e.model_copy(update={"config": fitted.config}))


def monotone_classes(profile: Profile, e: ExperimentRecord) -> frozenset[str]:
    """The failure classes that bar ``e``'s change on a whole side at its first failure: those
    the knobs it moves (its knob, a coupled move's enabling knob) declare monotone
    (``crash_region``: an OOM above the memory fraction it set). Any other configuration
    failure — one that another knob of the config declares monotone included (a K change out of
    memory at the config's memory fraction: memory another process still holds reads the
    same) — bars only once it reproduced and the champion still boots
    (``policy.config_failure``). Empty for the baseline: it changes no knob."""
    if e.knob is None or e.value is None:
        return frozenset()
    moved = {e.knob, *([e.coupled_knob] if e.coupled_knob is not None else [])}
    declared = {
        c for spec in profile.space.knobs if spec.name in moved for c in spec.monotone_failures
    }
    return frozenset(
        c
        for c in declared
        if (region := crash_region(profile, e.knob, e.value, e.config, c, _coupled(e))).at_least
        or region.at_most
    )


def _coupled(e: ExperimentRecord) -> tuple[str, Value] | None:
    """A coupled move's enabling knob and value (``agents.coupled``), else None."""
    if e.coupled_knob is None or e.coupled_value is None:
        return None
    return e.coupled_knob, e.coupled_value


def _barred(profile: Profile, ledger: Ledger, e: ExperimentRecord) -> KnownBad | None:
    """The region a decided experiment bars, if it bars one."""
    if e.status == Status.DISCARD:
        return guardrail_region(profile, ledger, e)
    if (
        e.knob is None
        or e.value is None
        or e.status not in _BARS
        # the infrastructure's fault (stuck clocks, a node unreachable), not the config's
        or e.failure_class in INFRASTRUCTURE
    ):
        return None
    source = _BARS[Status(e.status)]
    # a boot failure or a veto is pinned on the knob's value; wrong outputs come from an
    # interaction (graphs with one K), so only that whole config is barred
    coupled = _coupled(e)
    when = e.config.as_dict() if e.status == Status.INVALID else {e.knob: e.value}
    if coupled is not None and e.status != Status.INVALID:
        when[coupled[0]] = coupled[1]  # a coupled move bars the pair, never its first knob alone
    # why, in words that add to the source (never the status again: "invalid: invalid")
    reason = e.failure_class or clipped(e.failure_detail or "", 200)
    if e.status == Status.INVALID and not reason:
        verdict = ledger.verdict(e.id)  # what the outputs did: the greedy texts that differed
        reason = "" if verdict is None else clipped(verdict.reason, 200)
    if e.status == Status.VETOED:
        # the person's words, so every proposer learns why (the verdict's: a proposal's veto
        # or, for a change a stopped round left undecided, the experiment's)
        if closed(ledger, e) or timed_out(ledger, e):
            # closed because the profile could not run it, or vetoed by the queue's timeout:
            # no one judged its value
            return None
        verdict = ledger.verdict(e.id)
        reason = "vetoed" if verdict is None else verdict.reason
    region = (
        crash_region(profile, e.knob, e.value, e.config, e.failure_class, coupled)
        if e.status == Status.CRASH
        else KnownBad(when=when, reason=reason, source=source)
    )
    return region.model_copy(update={"reason": reason, "source": source})


def guardrail_region(profile: Profile, ledger: Ledger, e: ExperimentRecord) -> KnownBad | None:
    """The region a guardrail discard bars: none, unless the knob declares its guardrail
    monotone (``KnobSpec.monotone_guardrails``: MNBT below a value past the time-to-first-token
    guardrail), and the value lies on that side of the champion's (``_past_champion``). Then
    that side of the value, with every other knob as it was: the guardrail is
    measured against the champion, so the region holds only under the champion it was
    measured against (``holds``). Not a coupled move: it moved another knob too."""
    if e.knob is None or e.coupled_knob is not None or e.knob not in profile.space.names:
        return None
    value = e.value
    declared = profile.space.spec(e.knob).monotone_guardrails.items()
    if not declared or isinstance(value, bool) or not isinstance(value, int | float):
        return None  # asked before the ledger: most discards' knobs declare none
    verdict = ledger.verdict(e.id)
    side = next((s for rule, s in declared if verdict is not None and rule == verdict.rule), None)
    if verdict is None or side is None or not _past_champion(ledger, e, value, side):
        return None
    if verdict.rule == "ttft-guardrail" and guardrail_stalled(ledger, e, verdict) is not None:
        return None  # a busy host's window, by today's rule: whatever release judged it
    bound = {e.knob: value}
    return KnownBad(
        when={k: v for k, v in e.config.as_dict().items() if k != e.knob},
        at_least=bound if side == "above" else {},
        at_most=bound if side == "below" else {},
        reason=clipped(f"{verdict.rule} against its champion: {verdict.reason}", 200),
        source="guardrail",
    )


def _past_champion(ledger: Ledger, e: ExperimentRecord, value: float, side: str) -> bool:
    """Whether ``value`` lies on ``side`` of the champion's value of the knob (the proposal's
    old value): a guardrail declared monotone below a value (MNBT's time to first token) says
    nothing of the values between it and the champion when the discarded value is above the
    champion, and a bound there would bar the champion's own value. A change with no proposal
    to read it from is taken as on that side."""
    if e.proposal_id is None:
        return True
    old = ledger.proposal(e.proposal_id).old_value
    if isinstance(old, bool) or not isinstance(old, int | float):
        return True
    return value < old if side == "below" else value > old


def holds(region: KnownBad, champion_key: str, current_key: str) -> bool:
    """Whether a region decided under the champion ``champion_key`` bars anything under the
    champion ``current_key`` (both fitted to the profile): a guardrail's only under the
    champion it was measured against (``guardrail_region``), any other always."""
    return region.source != "guardrail" or champion_key == current_key


def crash_region(
    profile: Profile,
    knob: str,
    value: Value,
    config: Config,
    failure_class: str | None,
    coupled: tuple[str, Value] | None = None,
) -> KnownBad:
    """The region a boot failure of ``knob=value`` bars.

    By default the value itself, under any champion. A failure the knob declares
    monotone (an OOM at a memory fraction) bars that whole side of the value instead. A
    failure another knob declares monotone (``kv_cache_dtype=auto`` short of KV-cache
    memory, which ``gpu_memory_utilization`` declares for ``kv_capacity``) bars the value
    only on that side of the other knob's value in the config that failed: a larger
    memory fraction may fit it.

    A coupled move (``coupled``: its enabling knob and value, ``agents.coupled``) that fails
    bars the pair, never the first knob's value alone: each of the two knobs is bounded on
    the side it declares the failure monotone (``kv_cache_dtype=auto,
    gpu_memory_utilization<=0.86`` for ``kv_capacity``), else held at its value.
    """
    space = profile.space
    if coupled is not None:
        return _pair_region(profile, ((knob, value), coupled), config, failure_class)
    own = space.spec(knob).monotone_failures if knob in space.names else {}
    side = own.get(failure_class or "")
    if side is not None and isinstance(value, int | float) and not isinstance(value, bool):
        bound = {knob: value}
        if side == "above":
            return KnownBad(at_least=bound, reason="", source="crash")
        return KnownBad(at_most=bound, reason="", source="crash")
    at_least: dict[str, int | float] = {}
    at_most: dict[str, int | float] = {}
    for spec in space.knobs:
        other = spec.monotone_failures.get(failure_class or "")
        held = config.get(spec.name)
        if other is None or spec.name == knob or isinstance(held, bool):
            continue
        if isinstance(held, int | float):
            (at_least if other == "above" else at_most)[spec.name] = held
    return KnownBad(
        when={knob: value}, at_least=at_least, at_most=at_most, reason="", source="crash"
    )


def _pair_region(
    profile: Profile,
    moved: tuple[tuple[str, Value], tuple[str, Value]],
    config: Config,
    failure_class: str | None,
) -> KnownBad:
    """The region a failed coupled move bars (``crash_region``)."""
    space = profile.space
    when: dict[str, Value] = {}
    at_least: dict[str, int | float] = {}
    at_most: dict[str, int | float] = {}
    for name, value in moved:
        side = (space.spec(name).monotone_failures if name in space.names else {}).get(
            failure_class or ""
        )
        if side is not None and isinstance(value, int | float) and not isinstance(value, bool):
            (at_least if side == "above" else at_most)[name] = value
        else:
            when[name] = value
    names = {name for name, _ in moved}
    for spec in space.knobs:
        other = spec.monotone_failures.get(failure_class or "")
        held = config.get(spec.name)
        if other is None or spec.name in names or isinstance(held, bool):
            continue
        if isinstance(held, int | float):
            (at_least if other == "above" else at_most)[spec.name] = held
    return KnownBad(when=when, at_least=at_least, at_most=at_most, reason="", source="crash")
