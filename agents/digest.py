"""A compact digest of what a proposer knows, written for a language model to read.

Not the raw ledger: per knob, the values tried as changes with their verdicts and the measured
effect (mean delta against the champion of the time, with the spread over repeats); the
champion; the draft length's predicted effect (``agents.draft_model``); the constraints; what
a person vetoed and why; the known-bad regions with their failure classes; what is still
allowed; the budget. Everything is derived from a ``ProposalContext``, so the same context
always gives the same text.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Sequence

from agents.context import HistoryEntry, ProposalContext, describe_values, same_value
from agents.draft_model import predict
from agents.first_looks import open_changes
from knobs.spec import KnobSpec, Value, as_text, objective_text

#: How many of the latest experiments are listed one per line.
RECENT = 8
#: How many values of one knob are listed before the rest is counted.
MAX_VALUES = 40


def digest(context: ProposalContext, *, extra: Sequence[str] = ()) -> str:
    """The state of the search as sections of short lines (markdown headings).

    ``extra`` lines are added to the budget section (an LLM proposer's spend, say).
    Never raises.
    """
    sections = [
        _budget(context, extra),
        _champion(context),
        _knobs(context),
        _draft_model(context),
        _constraints(context),
        _open(context),
        _tried(context),
        _vetoes(context),
        _known_bad(context),
        _recent(context.history),
    ]
    return "\n\n".join(s for s in sections if s) + "\n"


def _budget(context: ProposalContext, extra: Sequence[str]) -> str:
    left = context.budget_left
    lines = [
        "## Budget",
        f"{left} experiment{'s' if left != 1 else ''} left in this round "
        "(a veto costs none; every other proposal costs one boot of every node and one pass "
        "of the bench cells).",
        *extra,
    ]
    return "\n".join(lines)


def _champion(context: ProposalContext) -> str:
    objective = (
        "not measured yet"
        if context.champion_objective is None
        else objective_text(context.champion_objective)
    )
    return "\n".join(
        [
            "## Champion",
            f"objective {objective} (higher is better); config {context.champion.key}:",
            describe_values(context.champion),
        ]
    )


def _knobs(context: ProposalContext) -> str:
    allowed: dict[str, list[Value]] = defaultdict(list)
    for change in context.candidates():
        allowed[change.knob].append(change.new)
    lines = ["## Knobs (name [champion value]: domain — what it does; values allowed now)"]
    for spec in context.space.knobs:
        values = allowed.get(spec.name, [])
        shown = _values(values) if values else "none (every other value is decided or barred)"
        what = f" — {spec.description}" if spec.description else ""
        prior = context.prior(spec.name)
        known = (
            ""
            if prior is None
            else f"; prior in force: {prior.p_null:.0%} of its changes do nothing, the rest "
            f"±{prior.effect_pct:.1f}%" + (f" ({prior.source})" if prior.source else "")
        )
        lines.append(
            f"- {spec.name} [{as_text(context.champion[spec.name])}]: "
            f"{spec.describe_domain()}{what}{known}; allowed now: {shown}"
        )
    return "\n".join(lines)


def _draft_model(context: ProposalContext) -> str:
    model = predict(context)
    if model is None:
        return ""
    lines = [
        f"## Draft length predicted from the champion's per-position acceptance "
        f"({model.knob}={model.current} now; a model, not a measurement)"
    ]
    lines += [f"- {model.describe(v)}" for v in sorted(model.change_pct)]
    return "\n".join(lines)


def _constraints(context: ProposalContext) -> str:
    if not context.space.forbidden:
        return ""
    lines = ["## Hard constraints (configurations matching these never run)"]
    lines += [f"- {describe_values(f.when)}: {f.reason}" for f in context.space.forbidden]
    return "\n".join(lines)


def _open(context: ProposalContext) -> str:
    still = list(open_changes(context).values())
    if not still:
        return ""
    lines = [
        "## Open for a second look (stopped for want of boots, still promising; proposing one "
        "again adds boots to what it measured)"
    ]
    for e in still:
        gain = e.second_look if e.second_look is not None else e.further_look
        promise = f"still promises {math.expm1(gain or 0.0) * 100:+.1f}%"
        last = (
            "" if e.delta_pct is None else f" (E[max(0, gain)]), last measured {e.delta_pct:+.1f}%"
        )
        spent = (
            ""
            if e.second_look is not None
            else "; its second looks are spent: worth a boot only when the next untried "
            "change (on average over the knobs left) promises less"
        )
        lines.append(
            f"- {e.knob}={as_text(e.value) if e.value is not None else '?'}: {promise}{last}{spent}"
        )
    return "\n".join(lines)


def _tried(context: ProposalContext) -> str:
    by_value: dict[str, list[tuple[Value, list[HistoryEntry]]]] = defaultdict(list)
    coupled: list[HistoryEntry] = []
    for entry in context.history:
        if entry.knob is None or entry.value is None:
            continue
        if entry.coupled_knob is not None:  # two knobs at once: listed apart
            coupled.append(entry)
            continue
        groups = by_value[entry.knob]
        for value, entries in groups:
            if same_value(value, entry.value):
                entries.append(entry)
                break
        else:
            groups.append((entry.value, [entry]))
    lines = [
        "## Changes tried, per knob (delta = objective against the champion of its time; "
        "± = standard deviation over repeats; n = how many times)"
    ]
    for spec in context.space.knobs:
        groups = by_value.get(spec.name, [])
        if not groups:
            lines.append(f"- {spec.name}: never changed")
            continue
        parts = [_group(spec, value, entries) for value, entries in _ordered(spec, groups)]
        lines.append(f"- {spec.name}: " + "; ".join(parts))
    if coupled:
        lines.append(
            "- coupled moves (a value that failed for another knob's reason, tried with that "
            "knob's next value; the orchestrator proposes them itself): "
            + "; ".join(e.describe() for e in coupled)
        )
    return "\n".join(lines)


def _ordered(
    spec: KnobSpec, groups: list[tuple[Value, list[HistoryEntry]]]
) -> list[tuple[Value, list[HistoryEntry]]]:
    order = {as_text(v): i for i, v in enumerate(spec.domain())}
    return sorted(groups, key=lambda g: order.get(as_text(g[0]), len(order)))


def _group(spec: KnobSpec, value: Value, entries: list[HistoryEntry]) -> str:
    verdicts = Counter(e.status for e in entries)
    verdict_text = ", ".join(f"{status}×{n}" for status, n in sorted(verdicts.items()))
    deltas = [e.delta_pct for e in entries if e.measured and e.delta_pct is not None]
    effect = ""
    if deltas:
        mean = sum(deltas) / len(deltas)
        if len(deltas) > 1:
            sd = math.sqrt(sum((d - mean) ** 2 for d in deltas) / (len(deltas) - 1))
            effect = f" delta {mean:+.1f}% ± {sd:.1f} (n={len(deltas)})"
        else:
            effect = f" delta {mean:+.1f}% (n=1, not repeated)"
    failures = sorted({e.failure_class for e in entries if e.failure_class})
    why = f" [{', '.join(failures)}]" if failures else ""
    return f"{as_text(value)}: {verdict_text}{effect}{why}"


def _vetoes(context: ProposalContext) -> str:
    vetoes = [r for r in context.known_bad if r.source == "veto"]
    if not vetoes:
        return ""
    lines = ["## Vetoed by a person (never propose these again; heed the reasons)"]
    lines += [f"- {describe_values(r.when)}: {r.reason}" for r in vetoes]
    return "\n".join(lines)


def _known_bad(context: ProposalContext) -> str:
    regions = [r for r in context.known_bad if r.source != "veto"]
    if not regions:
        return ""
    lines = ["## Known-bad regions (a configuration inside one never runs)"]
    lines += [f"- {r.region()} ({r.source}: {r.reason})" for r in regions]
    return "\n".join(lines)


def _recent(history: Sequence[HistoryEntry]) -> str:
    if not history:
        return "## Latest experiments\nnone yet"
    shown = history[-RECENT:]
    more = len(history) - len(shown)
    lines = [f"## Latest experiments (oldest first{f'; {more} earlier' if more else ''})"]
    lines += [f"- {e.describe()}" for e in shown]
    return "\n".join(lines)


def _values(values: Sequence[Value]) -> str:
    if len(values) <= MAX_VALUES:
        return ", ".join(as_text(v) for v in values)
    head = ", ".join(as_text(v) for v in values[:MAX_VALUES])
    return f"{head} … and {len(values) - MAX_VALUES} more"
