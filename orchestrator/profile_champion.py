"""The profile's ``champion:`` against the ledger's.

``champion:`` is the config a cluster starts from: its baseline, measured while the ledger has
no champion for the cluster. From then on every round starts from the ledger's champion,
measured, whatever ``champion:`` says. Two things follow, each said in one line.

A baseline a round left undecided (the infrastructure stopped it: a node away, a port held,
exit 5) is of ``champion:`` as it was when the round took it up. Should the user edit
``champion:`` before the same command resumes the round, that baseline is not what they mean
to measure: it is closed (``stale_baseline``: decided ``vetoed`` by the profile, rule
``champion-changed``, its boots and measurements kept and readable, nothing barred) and the
baseline of ``champion:`` as it is now is measured (``closed_lines``, said as the round
resumes).

Once the ledger has a champion, an edit of ``champion:`` changes nothing, which a user who made
it would not guess: ``ignored`` says which config is used (the ledger's, measured), how the two
differ, and how to start from ``champion:`` instead. ``status`` says it while it holds; a round
(and ``cluster up``) the first time it runs under that ``champion:`` (``said_once``: the
profile's revisions record its sections' digests, so a round under the same ``champion:``
says nothing more). Nothing is said while ``champion:`` is the config the ledger started from
(its baseline): a champion moved on by kept changes is what rounds are for.
"""

from __future__ import annotations

from knobs.config import Config
from knobs.spec import Value, as_text
from knobs.vocabulary import Kind, State, Status
from ledger import ChampionRecord, ExperimentRecord, Ledger
from orchestrator import revision
from orchestrator.closures import CHAMPION_RULE, Closure
from orchestrator.evolution import fit
from orchestrator.profile import Profile

#: How a user starts a cluster from ``champion:`` once the ledger has a champion for it (the
#: words ``profile_errors`` gives a champion outside a narrowed domain, too).
START_AFRESH = "run under a new ledger (ORCHESTRATE_LEDGER, ledger_url:) or another cluster.name"


def stale_baseline(profile: Profile, ledger: Ledger, e: ExperimentRecord) -> Closure | None:
    """Why undecided baseline ``e`` is closed without a boot more: its config (fitted to the
    profile: a knob gained since takes its default, as ``champion:`` does) is not the
    profile's ``champion:`` now. ``None``: ``e`` is no undecided baseline, or it is of the
    same config.

    Raises:
        LedgerError: the ledger failed.
    """
    if e.kind != Kind.BASELINE or e.state == State.DECIDED:
        return None
    then = fit(profile.space, ledger, e).config
    now = profile.initial_champion()
    moved = _moved(then, now)
    if not moved:
        return None
    changed = ", ".join(f"{k} {_text(then, k)} → {_text(now, k)}" for k in moved)
    booted = len(ledger.boots(e.id))
    reason = (
        f"champion: in profile {profile.name} changed since this baseline was taken up "
        f"({changed}): the baseline is closed without a verdict, its {booted} boot(s) kept and "
        "no boot more, and the baseline of champion: as it is now is measured; nothing is barred"
    )
    return Closure(
        CHAMPION_RULE,
        moved[0],
        reason,
        f"champion: changed since ({changed})",
        {"was": _pairs(then, moved), "now": _pairs(now, moved)},
    )


def closed_lines(profile: Profile, ledger: Ledger, round_id: int) -> list[str]:
    """What a resume of round ``round_id`` says first of each undecided baseline of the round
    that ``stale_baseline`` closes (the round closes it as it takes it up).

    Raises:
        LedgerError: the ledger failed.
    """
    lines = []
    for e in ledger.experiments(round_id=round_id):
        why = stale_baseline(profile, ledger, e)
        if why is None:
            continue
        then, now = why.stats["was"], why.stats["now"]
        lines.append(
            f"  the baseline left undecided (experiment #{e.id}) is of champion: as it was "
            f"({_said(then)}); champion: in profile {profile.name} says {_said(now)} now: "
            f"#{e.id} is closed, its boots kept, and the baseline of the new one is measured"
        )
    return lines


def stale_said(profile: Profile, ledger: Ledger, e: ExperimentRecord) -> str | None:
    """What ``status`` says of undecided experiment ``e`` where the resume closes it
    (``stale_baseline``); ``None`` where it does not.

    Raises:
        LedgerError: the ledger failed.
    """
    why = stale_baseline(profile, ledger, e)
    if why is None:
        return None
    return f"{why.said}, and the baseline of champion: as it is now is measured"


def ignored(profile: Profile, ledger: Ledger, champion: ChampionRecord | None) -> str | None:
    """The line saying that ``champion:`` is not used, where it differs from ``champion`` (the
    ledger's, fitted to the profile) and from the config the ledger started the cluster from
    (its last kept baseline, fitted); ``None``: no champion, or ``champion:`` is one of those.

    Raises:
        LedgerError: the ledger failed.
    """
    if champion is None:
        return None
    now = profile.initial_champion()
    moved = _moved(champion.config, now)
    if not moved:
        return None
    started = _started_from(profile, ledger)
    if started is not None and not _moved(started, now):
        return None  # champion: is still what the ledger started from: kept changes moved it
    return (
        f"champion: in profile {profile.name} is not the ledger's champion (experiment "
        f"#{champion.experiment_id}, measured), and the ledger's is used: it has "
        f"{_said(_pairs(champion.config, moved))} where champion: says "
        f"{_said(_pairs(now, moved))}; champion: starts only a cluster the ledger has no "
        f"champion for: to start from it, {START_AFRESH}"
    )


def said_once(profile: Profile, ledger: Ledger, champion: ChampionRecord | None) -> str | None:
    """``ignored``'s line, where the profile's ``champion:`` is not the one of the last profile
    recorded for the cluster (asked before this run records the profile: ``revision.record``),
    so a round says it once for each ``champion:`` written; ``None`` otherwise.

    Raises:
        LedgerError: the ledger failed.
    """
    last = revision.last(ledger, profile.cluster.name)
    now = revision.Revision.of(profile).sections.get("champion")
    if last is not None and last.sections.get("champion") == now:
        return None
    return ignored(profile, ledger, champion)


def _started_from(profile: Profile, ledger: Ledger) -> Config | None:
    """The config the ledger started the cluster from: its last baseline kept, fitted."""
    kept = [
        e
        for e in ledger.experiments(cluster=profile.cluster.name)
        if e.kind == Kind.BASELINE and e.status == Status.KEEP
    ]
    return fit(profile.space, ledger, kept[-1]).config if kept else None


def _moved(a: Config, b: Config) -> list[str]:
    return [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


def _text(config: Config, knob: str) -> str:
    return as_text(config[knob]) if knob in config else "(none)"


def _pairs(config: Config, knobs: list[str]) -> dict[str, Value]:
    return {k: config[k] for k in knobs if k in config}


def _said(pairs: object) -> str:
    """``knob=value`` pairs, as a line says them."""
    assert isinstance(pairs, dict)
    return ", ".join(f"{k}={as_text(v)}" for k, v in pairs.items())
