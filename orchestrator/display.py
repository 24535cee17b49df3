"""What a person sees during and after a round: a live progress line, then a table."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

from rich.console import Console, Group
from rich.live import Live
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from knobs.spec import as_text, objective_text
from knobs.vocabulary import Kind, Status
from ledger import ChampionRecord, ExperimentRecord, RoundRecord
from orchestrator.measurements import BootCount

#: wider than any row of a table (``whole_rows_width`` measures within it)
_UNBOUNDED = 10_000

_STYLE: dict[str, str] = {
    Status.KEEP: "bold green",
    Status.DISCARD: "yellow",
    Status.CRASH: "bold red",
    Status.INVALID: "magenta",
    Status.INCONCLUSIVE: "cyan",
    Status.VETOED: "dim",
}


def kept_on_resume(
    rnd: RoundRecord, asked: Mapping[str, str], profile_change: str | None
) -> list[str]:
    """What a resumed round runs with that differs from how it started (``asked``: budget,
    proposer, approval, seed as text, as the resume runs them), and a changed profile
    (``profile_change``: what changed since the round started, ``revision.said``): said,
    never silent. The budget is the round's (the next round takes another); a proposer, seed
    or approval differs only where the command gave its own, which runs this resume."""
    lines = []
    if "budget" in asked and asked["budget"] != str(rnd.budget):
        lines.append(
            f"  round {rnd.id} keeps its budget {rnd.budget} (this command asked for "
            f"{asked['budget']}): an unfinished round is resumed as it started; the next round "
            "takes the new one"
        )
    started = {"proposer": rnd.proposer, "approval": rnd.approve, "seed": str(rnd.seed)}
    lines += [
        f"  round {rnd.id} started with {what} {mine}; this command's {asked[what]} runs it "
        f"from here (a resume without it goes on with {mine})"
        for what, mine in started.items()
        if what in asked and asked[what] != mine
    ]
    if profile_change is not None:
        lines.append(
            f"  the profile changed since round {rnd.id} started {profile_change}: the round "
            "goes on under the profile as it is now"
        )
    return lines


def stopped_by_cap(rnd: RoundRecord, cap: str, done: int, gpu_hours: float) -> str:
    """The line a round stopped by its wall-clock or GPU-hours cap ends with."""
    if cap == "max-gpu-hours":
        limit = f"--max-gpu-hours {rnd.max_gpu_hours:g} ({gpu_hours:.2f} GPU-hours used)"
        again = "the same command with a larger --max-gpu-hours resumes it"
    else:
        limit = f"--max-hours {rnd.max_hours:g}"
        again = "the same command resumes it"
    return (
        f"round {rnd.id} stopped by {limit}: {done} of {rnd.budget} experiments done; "
        f"it stays open, and {again}"
    )


def exhausted(rnd: RoundRecord, done: int, why: str, left: int, refusals: Mapping[str, int]) -> str:
    """The line a round ends with when its proposer has no allowed change left (``why``: the
    proposer's account; ``left``: allowed one-knob changes outside its candidates, a finished
    sweep list's; ``refusals``: its candidates' refusals by kind): what was done, and what
    would give the next round something to try."""
    ways = []
    if left:
        ways.append("run another proposer (--proposer optuna), which takes the others")
    ways.append("give a knob more values, or add a knob, in the profile")
    if refusals.get("known-bad"):
        ways.append(
            "clear a known-bad region you know was not the config's doing (orchestrate "
            "known-bad list, then clear ID --reason)"
        )
    return (
        f"round {rnd.id} ended after {done} of {rnd.budget} experiments, nothing left to try: "
        f"{why}. Every one-knob change of the champion is decided under it or barred (one its "
        "boots did not settle is looked at again while it promises a gain); the next round has "
        "something to try only if you " + ", or ".join(ways)
    )


def describe(e: ExperimentRecord) -> str:
    """What an experiment changed, in words."""
    if e.kind == Kind.BASELINE:
        return "baseline (champion as configured)"
    return e.description or f"{e.knob} → {as_text(e.value) if e.value is not None else '?'}"


class RoundDisplay:
    """Live progress of a round: experiment i of N, the phase, elapsed time.

    On a terminal it redraws one status line; otherwise it prints one line per phase change.
    """

    def __init__(self, console: Console) -> None:
        self.console = console
        self._live: Live | None = None
        self._started = time.monotonic()
        self._exp_started = self._started
        self._header = ""
        self._phase = ""

    def __rich__(self) -> Group:
        now = time.monotonic()
        line = Text.assemble(
            (self._header, "bold"),
            "  ",
            (self._phase, "cyan"),
            "  ",
            (f"{now - self._exp_started:5.1f}s", "dim"),
            (f"  (round {now - self._started:.0f}s)", "dim"),
        )
        return Group(line)

    def start(self, title: str) -> None:
        """Begin the round's display."""
        self.console.print(Text(title, style="bold"))
        if self.console.is_terminal:
            self._live = Live(self, console=self.console, refresh_per_second=8, transient=True)
            self._live.start()

    def experiment(self, index: int, total: int, title: str) -> None:
        """A new experiment begins (index is 1-based within the round; 0 for the baseline)."""
        self._exp_started = time.monotonic()
        self._header = f"[{index}/{total}] {title}" if index else f"[baseline] {title}"
        self._phase = "starting"
        if self._live is None:  # `[baseline]` and a title's brackets are text, not markup
            self.console.print(self._header, markup=False, highlight=False)

    def phase(self, text: str) -> None:
        """The experiment's current phase (proposing, deploying node-2, cell 3 of 4 …)."""
        self._phase = text
        if self._live is None:
            self.console.print(f"    {text}", style="dim", highlight=False, markup=False)

    def note(self, text: str) -> None:
        """A line worth keeping above the live status, as it is (an error's ``[…]`` is text,
        not markup)."""
        self.console.print(text, highlight=False, markup=False)

    def decided(self, e: ExperimentRecord, reason: str, boots: BootCount | None = None) -> None:
        """An experiment was decided, and why (``""``: its description says it already);
        ``boots``: the boots it paid and the measurements it weighed, said where they differ
        or a boot failed (``BootCount.said``: the verdict's reason counts only the
        measurements it weighs)."""
        if boots is not None and boots.said:
            reason = f"{reason}; {boots.words()}" if reason else boots.words()
        status = e.status or "?"
        objective = "" if e.objective is None else f" objective {objective_text(e.objective)}"
        delta = "" if e.delta_pct is None or e.kind == Kind.BASELINE else f" ({e.delta_pct:+.2f}%)"
        change, by = describe(e), ""
        if status == Status.VETOED and " vetoed by " in change:
            # a person's veto: its description says who and why; the status word once, first
            change, by = change.split(" vetoed by ", 1)
            by = f" by {by}"
        # a person's veto names the proposal they decided by its number (``proposals veto
        # N``) beside the experiment's: #5 above "proposal 5 waits" is another change
        which = f"#{e.id}"
        if by and e.proposal_id is not None and e.proposal_id != e.id:
            which += f" (proposal {e.proposal_id})"
        self.console.print(
            Text.assemble(
                f"  {which} {change}: ",
                (status, _STYLE.get(status, "")),
                f"{by}{objective}{delta}",
                (f"  {reason}" if reason else "", "dim"),
            )
        )

    @contextmanager
    def paused(self) -> Iterator[None]:
        """No live redraw inside the block (a person is answering a prompt)."""
        live = self._live
        if live is None:
            yield
            return
        live.stop()
        try:
            yield
        finally:
            live.start()

    def stop(self) -> None:
        """End the live display."""
        if self._live is not None:
            self._live.stop()
            self._live = None


def experiments_table(
    experiments: Sequence[ExperimentRecord], champion: ChampionRecord | None, title: str
) -> Table:
    """The round's experiments as a table."""
    table = Table(title=title, title_justify="left")
    for column, justify in (
        ("#", "right"),
        ("proposal", "right"),
        ("change", "left"),
        ("objective", "right"),
        ("Δ%", "right"),
        ("accept", "right"),
        ("status", "left"),
        ("note", "left"),
    ):
        # a verdict is never cut ("inconclu…" in a log file's 80 columns): the change wraps
        width = len("inconclusive") if column == "status" else None
        table.add_column(column, justify=justify, min_width=width)  # type: ignore[arg-type]
    for e in experiments:
        status = e.status or e.state
        note: str = e.failure_class or ""
        if champion is not None and champion.experiment_id == e.id:
            note = (note + " champion").strip()
        table.add_row(
            str(e.id),
            "-" if e.proposal_id is None else str(e.proposal_id),
            describe(e),
            "-" if e.objective is None else objective_text(e.objective),
            "-" if e.delta_pct is None or e.kind == Kind.BASELINE else f"{e.delta_pct:+.2f}",
            "-" if e.accept_len is None else f"{e.accept_len:.2f}",
            Text(status, style=_STYLE.get(status, "")),
            note,
        )
    return table


def whole_rows_width(console: Console, table: Table) -> int | None:
    """The width to print ``table`` at on ``console``: where its output is no terminal (a log
    file, ``nohup``, a pipe) and ``COLUMNS`` names no width, as wide as its rows need, so each
    row is one line as a wide terminal shows it (rich's default there is 80 columns: a change
    wrapped over four lines, a knob's name cut); ``None``: the console's own (a terminal's
    width, or the one ``COLUMNS`` asks for)."""
    if console.is_terminal or os.environ.get("COLUMNS", "").strip().isdigit():
        return None
    wide = console.options.update_width(_UNBOUNDED)
    needed = Measurement.get(console, wide, table).maximum
    return max(console.width, needed)
