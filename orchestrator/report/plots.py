"""The report's pictures, drawn with matplotlib's object API (``Figure``, no pyplot: no global
state, no display needed) as PNG bytes."""

from __future__ import annotations

import io

from matplotlib.figure import Figure

from knobs.spec import objective_text
from knobs.vocabulary import Status
from orchestrator.report.records import ReportData
from orchestrator.round_boots import USES

#: Marker and colour per verdict (the progress plot's legend).
STYLE: dict[str, tuple[str, str]] = {
    Status.KEEP: ("^", "#2ca02c"),
    Status.DISCARD: ("o", "#7f7f7f"),
    Status.INCONCLUSIVE: ("s", "#1f77b4"),
    Status.INVALID: ("D", "#ff7f0e"),
    Status.CRASH: ("X", "#d62728"),
    Status.VETOED: ("v", "#9467bd"),
}
USE_COLOURS = ("#8c564b", "#1f77b4", "#2ca02c", "#bcbd22", "#d62728", "#7f7f7f", "#c7c7c7")
DPI = 110


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight")
    return buf.getvalue()


def progress(data: ReportData) -> bytes:
    """Every experiment's objective in order, the champion as a step line, markers by verdict;
    the round's starting champion and its best. A crash or veto has no objective: its marker
    sits on the floor of the plot."""
    fig = Figure(figsize=(9, 4.2))
    ax = fig.add_subplot()
    xs = list(range(1, len(data.points) + 1))
    measured = [p.objective for p in data.points if p.objective]
    steps = [c for c in data.champion_after if c is not None]
    values = measured + steps
    floor = min(values) * 0.97 if values else 0.0
    for status, (marker, colour) in STYLE.items():
        mine = [(x, p) for x, p in zip(xs, data.points, strict=True) if p.status == status]
        if not mine:
            continue
        ax.scatter(
            [x for x, _ in mine],
            [p.objective if p.objective else floor for _, p in mine],
            marker=marker,
            color=colour,
            s=46,
            label=f"{status} ({len(mine)})",
            zorder=3,
        )
    if steps:
        champion = [c if c is not None else float("nan") for c in data.champion_after]
        ax.step(xs, champion, where="post", color="black", lw=1.4, label="champion", zorder=2)
        start, best = objective_text(steps[0]), objective_text(max(steps))
        ax.axhline(steps[0], color="#555555", ls="--", lw=0.9, label=f"start {start}")
        ax.axhline(max(steps), color="#2ca02c", ls=":", lw=1.2, label=f"best {best}")
    ax.set_xticks(xs, [f"#{p.experiment}" for p in data.points], rotation=90, fontsize=7)
    ax.set_xlabel("experiment, in the order decided")
    ax.set_ylabel("objective")
    ax.set_title(f"round {data.round.id} on {data.cluster}: progress")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:  # nothing decided yet: no legend (nor its warning)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _png(fig)


def effects(data: ReportData) -> bytes:
    """Per knob and value: the measured changes against the champion of the time, and the
    last verdict's 95 % interval."""
    rows = data.knobs
    fig = Figure(figsize=(9, max(2.2, 0.32 * len(rows) + 1.2)))
    ax = fig.add_subplot()
    if not rows:
        ax.text(0.5, 0.5, "no candidate was measured", ha="center", va="center")
        ax.set_axis_off()
        return _png(fig)
    for y, row in enumerate(rows):
        if row.interval is not None:
            ax.plot(row.interval, [y, y], color="#1f77b4", lw=3, alpha=0.5, solid_capstyle="butt")
        for effect, status in zip(row.effects, row.statuses, strict=True):
            marker, colour = STYLE[status]
            ax.scatter([effect], [y], marker=marker, color=colour, s=30, zorder=3)
        if row.crashes:
            marker, colour = STYLE[Status.CRASH]
            ax.scatter([0.0], [y], marker=marker, color=colour, s=40, zorder=3)
    ax.axvline(0.0, color="#555555", lw=0.8)
    ax.set_yticks(range(len(rows)), [f"{r.knob}={r.value}" for r in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel(
        "change against the champion of the time, % (markers: verdicts as in the progress "
        "plot, a crash at 0; bar: the last verdict's 95 % interval)"
    )
    ax.set_title("per knob and value")
    ax.grid(axis="x", alpha=0.3)
    return _png(fig)


def boots(data: ReportData) -> bytes:
    """Where the boots' hours went, per experiment, stacked by use; and the totals by use."""
    fig = Figure(figsize=(9, 3.8))
    left, right = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 1]})
    numbers = sorted(data.boot_hours)
    scale = data.gpus if data.gpus else 1
    unit = "GPU-hours" if data.gpus else "boot hours"
    bottom = [0.0] * len(numbers)
    for use, colour in zip(USES, USE_COLOURS, strict=True):
        heights = [data.boot_hours[n].get(use, 0.0) * scale for n in numbers]
        if any(heights):
            left.bar(range(len(numbers)), heights, bottom=bottom, color=colour, label=use)
            bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    left.set_xticks(range(len(numbers)), [f"#{n}" for n in numbers], rotation=90, fontsize=7)
    left.set_ylabel(unit)
    left.set_title(f"{unit} per experiment ({data.gpu_hours:.2f} GPU-hours in all)")
    if any(bottom):
        left.legend(fontsize=7)
    counts = [data.boots_by_use.get(use, 0) for use in USES]
    right.barh(range(len(USES)), counts, color=USE_COLOURS)
    right.set_yticks(range(len(USES)), list(USES), fontsize=7)
    right.invert_yaxis()
    right.set_title("boots by use")
    return _png(fig)


def all_plots(data: ReportData) -> dict[str, bytes]:
    """Every picture of the report, by file name."""
    return {
        "progress.png": progress(data),
        "effects.png": effects(data),
        "boots.png": boots(data),
    }
