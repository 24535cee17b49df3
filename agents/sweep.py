"""The sweep proposer: a fixed list of one-knob changes, or every neighbour of the champion."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from agents.context import ProposalContext
from agents.proposal import ONE_EXPERIMENT, Proposal, ProposalExhausted
from knobs.config import Change
from knobs.errors import KnobError
from knobs.spec import Value, as_text, printable


class SweepProposer:
    """Walks a fixed list of ``{knob: value}`` entries in order, each applied to the champion
    of the moment; without a list, every ``space.neighbours(champion)`` in order.

    Stateless: the position comes from the context. A list entry is done once any experiment
    in the history judged that knob at that value (so a list is walked once, even across
    champion changes); an experiment nobody judged (``HistoryEntry.judged``: a veto of the
    queue's timeout, a closure by the profile, a failure of the infrastructure's) leaves it
    to do. The next entry that is not done is proposed unless it is not allowed now (unknown
    knob, bad value, no change against this champion, forbidden, decided, known-bad; a
    timeout's veto is decided for the rest of its sitting), in which case it is skipped and
    the proposal's ``skipped`` note says why. Without a list, the first allowed neighbour is
    proposed: a coordinate sweep that starts again around each new champion.
    """

    name = "sweep"

    def __init__(self, changes: Sequence[Mapping[str, Value]] | None = None) -> None:
        """Raises:
        KnobError: an entry does not name exactly one knob.
        """
        entries: list[tuple[str, Value]] | None = None
        if changes is not None:
            entries = []
            for i, entry in enumerate(changes, start=1):
                if len(entry) != 1:
                    raise KnobError(
                        f"sweep entry {i} must name exactly one knob, not {printable(dict(entry))}"
                    )
                [(knob, value)] = entry.items()
                entries.append((knob, value))
        self.entries = entries

    def propose(self, context: ProposalContext) -> Proposal:
        """The next allowed entry of the sweep.

        Raises:
            ProposalExhausted: the list (or the champion's neighbours) has no allowed entry left.
        """
        if self.entries is None:
            return self._neighbours(context)
        refusals: Counter[str] = Counter()
        skipped: list[str] = []
        for position, (knob, raw) in enumerate(self.entries, start=1):
            what = f"entry {position} ({knob}={_text(raw)})"
            try:
                value = context.space.spec(knob).parse(raw)
            except KnobError as e:
                refusals["invalid"] += 1
                skipped.append(f"{what}: {e.message}")
                continue
            if context.tries(knob, value, judged=True):
                refusals["done"] += 1
                continue
            change = Change(knob=knob, old=context.champion[knob], new=value)
            refused = context.refusal(change)
            if refused is not None:
                refusals[refused.kind] += 1
                skipped.append(f"{what}: {refused.reason}")
                continue
            notes = {"position": str(position), "entries": str(len(self.entries))}
            if skipped:
                notes["skipped"] = "; ".join(skipped)
            where = f"entry {position} of the {len(self.entries)} in the profile's sweep"
            return self._proposal(context, change, where, notes)
        raise ProposalExhausted.after(
            self.name,
            len(self.entries),
            dict(refusals),
            what="sweep entries",
            left=len(context.candidates()),
        )

    def _neighbours(self, context: ProposalContext) -> Proposal:
        neighbours = context.space.neighbours(context.champion)
        for position, change in enumerate(neighbours, start=1):
            if context.refusal(change) is None:
                return self._proposal(
                    context,
                    change,
                    f"neighbour {position} of {len(neighbours)} of the champion",
                    {"position": str(position), "entries": str(len(neighbours))},
                )
        raise ProposalExhausted.after(
            self.name, len(neighbours), context.refusals(neighbours), what="neighbours"
        )

    def _proposal(
        self, context: ProposalContext, change: Change, where: str, notes: dict[str, str]
    ) -> Proposal:
        before = [
            e
            for e in context.history
            if e.knob == change.knob and e.measured and e.delta_pct is not None
        ]
        if before:
            last = before[-1]
            effect = (
                f"unknown; the last measured change of {change.knob} "
                f"(to {_text(last.value)}) "
                f"moved the objective {last.delta_pct:+.1f}%"
            )
        else:
            effect = f"unknown: {change.knob} has not been measured as a change yet"
        return Proposal(
            change=change,
            source=self.name,
            hypothesis=f"{change.describe()}: {where}; a sweep measures every step, "
            "it does not predict",
            expected_effect=effect,
            risk=context.risk_of(change),
            estimated_cost=ONE_EXPERIMENT,
            notes=notes,
        )


def _text(value: object) -> str:
    return as_text(value) if isinstance(value, bool | int | float | str) else printable(value)
