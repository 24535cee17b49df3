"""The report as one self-contained HTML page: the pictures inline (``data:`` URIs, so the file
opens anywhere on its own), the tables, the launcher diff. Every text from the ledger is
escaped. A script marks on ``<body>`` how many pictures the browser decoded
(``data-images-decoded``), which is how a test in headless Chromium knows they were drawn."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from datetime import datetime
from html import escape

from knobs.spec import as_text, objective_text
from knobs.vocabulary import GUARDRAIL_RULES, Kind, RoundStatus, Status
from orchestrator.report.records import Point, ReportData
from orchestrator.round_boots import INFRASTRUCTURE_USES, USES
from orchestrator.timestamps import utc_minute

CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.15em; margin-top: 1.8em; }
table { border-collapse: collapse; font-size: 0.85em; }
td, th { border-bottom: 1px solid #ddd; padding: 3px 8px; text-align: left; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
.keep { color: #2ca02c; font-weight: 600; } .crash { color: #d62728; }
.invalid { color: #ff7f0e; } .inconclusive { color: #1f77b4; }
pre { background: #f6f6f6; padding: 0.8em; overflow-x: auto; font-size: 0.8em; }
img { max-width: 100%; }
"""

SCRIPT = """
window.addEventListener("load", function () {
  var images = Array.prototype.slice.call(document.images);
  var decoded = images.filter(function (i) { return i.complete && i.naturalWidth > 0; });
  document.body.setAttribute("data-images", String(images.length));
  document.body.setAttribute("data-images-decoded", String(decoded.length));
});
"""


def _delta(value: float | None) -> str:
    return "" if value is None else f"{value:+.2f}"


def _objective(value: float | None) -> str:
    return "" if value is None else objective_text(value)


def _interval(value: tuple[float, float] | None) -> str:
    return "" if value is None else f"{value[0]:+.1f} … {value[1]:+.1f}"


def _measured(p: Point) -> str:
    """An experiment's interval cell: the verdict's 95 % interval, with the rule that decided
    when it was not the posterior's (a guardrail or a check decides whatever the gain, the
    threshold policy on one run: the interval is then the noise model's of what was measured);
    or, never an empty cell, why there is none."""
    if p.rule in GUARDRAIL_RULES:
        rule = f"decided by guardrail {p.rule}"
    elif p.rule in _CHECKS:
        rule = f"decided by its {p.rule} check"
    else:
        rule = "one run: the noise model's" if p.rule == "threshold" else ""
    if p.interval is not None:
        return f"{_interval(p.interval)} ({rule})" if rule else _interval(p.interval)
    if p.kind == Kind.BASELINE:
        why = "the champion's own measurement, nothing to compare"
    elif p.status == Status.CRASH:
        why = "crashed: nothing measured"
    elif p.status == Status.VETOED:
        why = "vetoed: not judged on a measurement"
    elif p.rule == "threshold":
        why = "one run, no noise estimate recorded"
    else:
        why = f"{rule}, no noise estimate recorded" if rule else "no noise estimate recorded"
    return f"—, {why}"


#: the verdict's checks that decide before the gain is weighed (``verdict._validity``)
_CHECKS = ("greedy-mismatch", "greedy-unchecked", "clocks")


def _boots(boots: int, failed: int) -> str:
    """A boots cell: ``2 (1 failed)``."""
    return f"{boots} ({failed} failed)" if failed else str(boots)


def _img(name: str, png: bytes, alt: str) -> str:
    data = base64.b64encode(png).decode("ascii")
    return f'<img src="data:image/png;base64,{data}" alt="{escape(alt)}" id="{escape(name)}">'


def _experiments(data: ReportData) -> str:
    rows = []
    for p in data.points:
        rule = p.rule if p.failure is None else f"{p.rule} ({p.failure})"
        rows.append(
            "<tr>"
            f'<td class="n">#{p.experiment}</td>'
            f'<td class="n">{"" if p.proposal is None else p.proposal}</td>'
            f"<td>{escape(p.label)}</td>"
            f'<td class="{escape(p.status)}">{escape(p.status)}</td>'
            f'<td class="n">{_objective(p.objective)}</td>'
            f'<td class="n">{_delta(p.delta_pct)}</td>'
            f"<td>{'' if p.compared is None else escape(p.compared.cell())}</td>"
            f'<td class="n">{escape(_measured(p))}</td>'
            f'<td class="n">{_boots(p.boots, p.failed_boots)}</td>'
            f'<td class="n">{p.measurements}</td><td>{escape(rule)}</td>'
            "</tr>"
        )
    # boots: what the cluster paid (its GPU-hours); measurements: what the verdict weighed (a
    # measurement interrupted and finished on a new boot is two boots, one measurement)
    head = (
        "<tr><th>#</th><th>proposal</th><th>change</th><th>verdict</th><th>objective</th>"
        "<th>Δ %</th><th>Δ against: its champion's level in force then</th>"
        "<th>95 % interval</th><th>boots</th><th>measurements</th><th>rule</th></tr>"
    )
    return f"<table>{head}{''.join(rows)}</table>{_against(data)}"


def _against(data: ReportData) -> str:
    """Under the table, where a row's objective beside its champion's row reads the other way
    round from its Δ: what the Δ is against (``compared_with``)."""
    odd = [p.compared for p in data.points if p.compared is not None and p.compared.misleading]
    if not odd:
        return ""
    rows = ", ".join(
        f"#{c.experiment} ({c.objective:.1f}, {c.delta_pct:+.2f} %; #{c.champion}'s row "
        f"{c.row:.1f}, its level then {c.level:.1f})"
        for c in odd
        if c.row is not None
    )
    return (
        "<p>A Δ is against the champion's level in force when the change was judged (its boots "
        "as measured again by then), not against the objective its row keeps (what its own "
        f"verdict measured): so {escape(rows)} read the other way round from their "
        "champion's row.</p>"
    )


def _knobs(data: ReportData) -> str:
    if not data.knobs:
        return "<p>No candidate was measured.</p>"
    rows = []
    for r in data.knobs:
        prior = ""
        if r.prior is not None:
            source = r.prior.source or "the profile's"
            prior = f"{r.prior.p_null:.0%} null, ±{r.prior.effect_pct:.1f} % ({source})"
        effects = ", ".join(f"{e:+.1f}" for e in r.effects)
        rows.append(
            f"<tr><td>{escape(r.knob)}</td><td>{escape(r.value)}</td>"
            f'<td class="n">{escape(effects)}</td><td class="n">{_interval(r.interval) or "—"}</td>'
            f'<td class="n">{_boots(r.boots, r.failed_boots)}</td>'
            f'<td class="n">{r.measurements}</td><td>{escape(r.verdicts)}</td>'
            f"<td>{escape(prior)}</td></tr>"
        )
    head = (
        "<tr><th>knob</th><th>value</th><th>measured Δ %</th><th>95 % interval</th>"
        "<th>boots</th><th>measurements</th><th>verdicts</th><th>prior in force</th></tr>"
    )
    return f"<table>{head}{''.join(rows)}</table>"


def _spend(data: ReportData) -> str:
    by_use = ", ".join(f"{data.boots_by_use.get(u, 0)} {u}" for u in USES)
    gpus = f"{data.gpus} GPU(s) per boot" if data.gpus else "nodes that declare no GPU"
    llm = (
        f"${data.llm_usd:.4f} over {data.llm_calls} LLM request(s)"
        if data.llm_calls
        else "no LLM was asked"
    )
    fell_back = data.fallbacks.words()
    if fell_back is not None:  # a night the LLM did not steer is not one it did
        llm = f"{llm}; {fell_back}"
    booted = data.tally.boots  # as ``status`` counts them (``round_boots``)
    weighed = f"{data.tally.measurements} measurement(s) weighed by its verdicts"
    return (
        f"<p>{booted} boot{'' if booted == 1 else 's'} ({escape(by_use)}), {weighed}; "
        f"{data.gpu_hours:.2f} GPU-hours on {escape(gpus)}; {escape(llm)}.</p>"
    )


def _infrastructure(data: ReportData) -> str:
    """The boots the cluster cost, not the configs, and what stopped the round short."""
    hours = sum(h.get(u, 0.0) for h in data.boot_hours.values() for u in INFRASTRUCTURE_USES)
    scale, unit = (data.gpus, "GPU-hours") if data.gpus else (1, "boot hours")
    cost = sum(data.boots_by_use.get(u, 0) for u in INFRASTRUCTURE_USES)
    lines = [
        f"<p>{cost} boot(s) were the infrastructure's, not a config's ({hours * scale:.2f} "
        f"{unit}): failed for a node's reasons, or set aside for a node's clocks.</p>"
        if cost
        else "<p>No boot failed for a node's reasons or was set aside for a node's clocks.</p>"
        if data.disturbed_boots
        else "<p>No boot was the infrastructure's: none failed for a node's reasons or was set "
        "aside for a node's clocks.</p>"
    ]
    if (disturbed := data.tally.disturbed_words()) is not None:
        lines.append(f"<p>{escape(disturbed)}.</p>")
    if data.infrastructure_failures:
        failed = "".join(
            f"<li>{escape(cls)}: {escape(detail)} (×{n})</li>"
            for (cls, detail), n in sorted(
                data.infrastructure_failures.items(), key=lambda item: (-item[1], item[0])
            )
        )
        lines.append(f"<p>Failed for the infrastructure's reasons:</p><ul>{failed}</ul>")
    if data.clocks_off_by_node:
        by_node = ", ".join(
            f"node-{rank} in {n} boot(s)" for rank, n in sorted(data.clocks_off_by_node.items())
        )
        lines.append(f"<p>Clocks off, by node: {escape(by_node)}.</p>")
    lines.append(_interruptions(data))
    return "".join(lines)


def _interruptions(data: ReportData) -> str:
    """What stopped the round short and each time it was taken up again: a stop recorded
    (its line and exit code), or a run killed without a word, found by its resume (recorded,
    or inferred from the boots it closed); and what the boots a killed run left open came to."""
    if not data.stops and not data.resumes:
        return "<p>Nothing stopped the round short.</p>"
    items = []
    for stop in data.stops:
        went_on = (
            f"went on at {utc_minute(stop.resumed_at)}"
            if stop.resumed_at is not None
            else "not gone on since: the same command resumes it"
        )
        items.append(
            f"<li>stopped at {utc_minute(stop.at)} (exit {escape(str(stop.exit_code))}): "
            f"{escape(stop.line)}; {went_on}</li>"
        )
    for r in data.resumes:
        if r.stop is not None and not r.left_open and not r.closed_for:
            continue  # its stop's item says when it went on
        if r.stop is None:
            how = (
                f"killed with no stop recorded (kill -9, a crash, the host lost, or "
                "suspended past its lease); resumed at "
                f"{utc_minute(r.at)}"
                if r.recorded
                else f"killed with no stop recorded; resumed by {utc_minute(r.at)}, when "
                "the resume closed the boots it had left open (this release's resumes are "
                "recorded; that one was not)"
            )
        else:
            how = f"resumed at {utc_minute(r.at)} after the stop at {utc_minute(r.stop.created_at)}"
        left = "".join(f"<li>{escape(b.words())}</li>" for b in r.left_open)
        if r.closed_for:
            how += f". It closed {_closed_for(r.closed_for)}"
        if r.left_open:
            how += ". The run before it had left open:"
        items.append(f"<li>{escape(how)}{f'<ul>{left}</ul>' if left else ''}</li>")
    killed = sum(1 for r in data.resumes if r.stop is None)
    head = (
        f"<p>The round was stopped short {len(data.stops)} time(s) with a stop recorded and "
        f"killed {killed} time(s) without one; it was resumed {len(data.resumes)} time(s).</p>"
    )
    return f"{head}<ul>{''.join(items)}</ul>"


def _closed_for(closed: dict[int, datetime]) -> str:
    """``boot #2 and boot #3, left open before the resume at 06:05 UTC, which was killed
    before it closed them``: what a resume closed for an earlier, killed one."""
    by: dict[datetime, list[int]] = {}
    for boot, at in sorted(closed.items()):
        by.setdefault(at, []).append(boot)
    parts = []
    for at, ids in sorted(by.items()):
        boots = " and ".join(f"boot #{i}" for i in ids)
        parts.append(
            f"{boots}, left open before the resume at {utc_minute(at)}, which was killed before "
            f"it closed {'it' if len(ids) == 1 else 'them'}"
        )
    return "; ".join(parts)


def _champion(data: ReportData) -> str:
    if data.champion_config is None:
        return "<p>No champion.</p>"
    settings = ", ".join(f"{k}={as_text(v)}" for k, v in data.champion_config.items())
    same = (
        "The round ended with the champion it started from."
        if data.round.status == RoundStatus.DONE
        else "The champion is still the one the round started from (the round is not over)."
    )
    diff = f"<pre>{escape(data.launcher_diff)}</pre>" if data.launcher_diff else f"<p>{same}</p>"
    level = "" if data.level is None else f"<p>The champion, {escape(data.level.words())}.</p>"
    if data.cells is not None:
        said = data.cells.words()
        level += f"<p>{escape(said[:1].upper() + said[1:])}.</p>"
    if data.past:  # a later round ran since: the page says this one as it ended
        level += (
            "<p>The champion as this round left it (later rounds ran since), its config as the "
            "ledger recorded it; its launchers against the starting one are as the profile "
            "renders them now.</p>"
        )
    return f"<p><code>{escape(settings)}</code></p>{level}{diff}"


def _as_run(started: str, resumed: list[str | None]) -> str:
    """A setting the round started with (its proposer, its approval mode), and each other one
    a resume ran it with (``auto (resumed with queue)``); where a resume's is not recorded (a
    release from before), the one it started with, said as such."""
    if any(r is None for r in resumed):
        return f"{started} at its start (what its resumes ran with is not recorded)"
    others: list[str] = []
    for r in resumed:
        if r is not None and r != (others[-1] if others else started):
            others.append(r)
    return f"{started} (resumed with {', then '.join(others)})" if others else started


def _state(data: ReportData) -> str:
    """The round's state for the page's first line: ``done``, ``running``, or, for an open
    round whose last stop short nothing went on from (its cap, a node away), ``stopped at …
    UTC (open; see below)``."""
    last = data.stops[-1] if data.stops else None
    if data.round.status != RoundStatus.RUNNING or last is None or last.resumed_at is not None:
        return data.round.status
    return f"stopped at {utc_minute(last.at)} (open: the same command resumes it; see below)"


def page(data: ReportData, pictures: Mapping[str, bytes]) -> str:
    """The whole HTML page."""
    rnd = data.round
    title = f"orchestrate: round {rnd.id} on {data.cluster}"
    vetoed = f" ({data.vetoed} vetoed besides)" if data.vetoed else ""
    # what it compares, in status's words: the champions' levels in force, not their rows
    gain = "" if data.gain is None or not data.points else f", {data.gain.words()}"
    summary = (
        f"Profile {escape(data.profile)}; {escape(_state(data))}, {data.done} of {rnd.budget} "
        f"experiments done{vetoed}, "
        f"proposer {escape(_as_run(rnd.proposer, [r.proposer for r in data.resumes]))}, "
        f"approval {escape(_as_run(rnd.approve, [r.approve for r in data.resumes]))}"
        f"{escape(gain)}; started {utc_minute(rnd.started_at)}."
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>
<style>{CSS}</style><script>{SCRIPT}</script></head>
<body>
<h1>{escape(title)}</h1>
<p>{summary}</p>
<h2>Progress</h2>
{_img("progress", pictures["progress.png"], "progress: objective per experiment")}
<h2>Experiments</h2>
{_experiments(data)}
<h2>Per knob and value</h2>
{_img("effects", pictures["effects.png"], "measured effect per knob and value")}
{_knobs(data)}
<h2>Where the boots and GPU-hours went</h2>
{_img("boots", pictures["boots.png"], "boots and GPU-hours by use")}
{_spend(data)}
<h2>The infrastructure's share, and what stopped the round short</h2>
{_infrastructure(data)}
<h2>The champion's launcher against the starting one</h2>
{_champion(data)}
</body></html>
"""
