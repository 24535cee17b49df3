"""``results.tsv``: one row per decided experiment, oldest first; the same ledger gives the
same bytes. A coupled move (``agents.coupled``) reads ``a+b`` in the knob column and ``v+w``
in the value column; its description has both knobs' old and new values."""

from __future__ import annotations

from collections.abc import Iterable

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


def tsv_rows(experiments: Iterable[ExperimentRecord]) -> list[str]:
    """The lines of results.tsv (header first), without trailing newlines."""
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
                    _clean(e.description) or "-",
                )
            )
        )
    return lines


def tsv_text(experiments: Iterable[ExperimentRecord]) -> str:
    """The whole results.tsv as text."""
    return "\n".join(tsv_rows(experiments)) + "\n"
