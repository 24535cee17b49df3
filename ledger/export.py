"""``results.tsv``: one row per decided experiment, oldest first; the same ledger gives the
same bytes. A coupled move (``agents.coupled``) reads ``a+b`` in the knob column and ``v+w``
in the value column; its description has both knobs' old and new values. A row's columns are
what its verdict recorded; ``notes`` add what a person must read beside them (the champion's
level in force, measured again since: ``orchestrator.champion_level``; what a row's Δ is against
where its objective beside its champion's reads the other way round: ``orchestrator.
compared_with``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from knobs.spec import as_text
from knobs.vocabulary import UNMEASURED, State
from ledger.records import ExperimentRecord

HEADER = (
    "experiment",
    "objective",
    "delta_pct",
    "accept_len",
    "status",
    "knob",
    "value",
    "description",
)


def _clean(text: str) -> str:
    # a tab or newline inside a field would break every reader of the file
    return " ".join(text.split())


def tsv_rows(
    experiments: Iterable[ExperimentRecord], notes: Mapping[int, str] | None = None
) -> list[str]:
    """The lines of results.tsv (header first), without trailing newlines; ``notes``: by
    experiment, what its description adds after ``; ``."""
    lines = ["\t".join(HEADER)]
    for e in experiments:
        if e.state != State.DECIDED or e.status is None:
            continue
        # no objective of its own: the row carries zeros, as autoresearch logs a crash
        zero = e.status in UNMEASURED
        objective = 0.0 if zero or e.objective is None else e.objective
        delta = 0.0 if zero or e.delta_pct is None else e.delta_pct
        accept = 0.0 if zero or e.accept_len is None else e.accept_len
        knob = e.label or "-"
        value = "-" if e.value is None else as_text(e.value)
        if e.coupled_knob is not None and e.coupled_value is not None:
            # a coupled move: both knobs and both values, ``a+b`` and ``v+w``
            value += f"+{as_text(e.coupled_value)}"
        description = _clean(e.description) or "-"
        if notes and e.id in notes:
            description = f"{description}; {_clean(notes[e.id])}"
        lines.append(
            "\t".join(
                (
                    str(e.id),
                    f"{objective:.2f}",
                    f"{delta:+.2f}",
                    f"{accept:.3f}",
                    e.status,
                    _clean(knob),
                    _clean(value),
                    description,
                )
            )
        )
    return lines


def tsv_text(
    experiments: Iterable[ExperimentRecord], notes: Mapping[int, str] | None = None
) -> str:
    """The whole results.tsv as text (``notes``: as ``tsv_rows``)."""
    return "\n".join(tsv_rows(experiments, notes)) + "\n"
