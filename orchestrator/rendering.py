"""What a boot rendered: a digest of its launchers, and whether a measurement counts for a
config as the profile renders it now.

A profile may change what a config runs without changing the config: a knob dropped (its flag
no longer passed, so the engine's own default runs), a knob gained whose value renders a flag,
a launcher edited. The boots before such a change measured another engine: their readings
and greedy texts stay in the ledger, set aside, and the champion is measured again before a
change is judged against it (``policy.next_action``, as for a cell redefined), and an
interrupted measurement continues as a new one rather than across two launchers.

Each boot records the digest of the launchers it rendered (schema 9, ``boot.rendering``). A
boot recorded before has none: it counts unless the ledger recorded a knob dropped from the
champion after it started (``legacy_cut``).

The engine reads its flags and values, not their order: the digest a boot records is of its
launchers with the knobs' pieces in an order of their own (what each renders, ``_canonical``),
so a knob renamed (``knob_renames``: a catalog knob's entry moves to the profile's ``knobs:``,
whose flags come after the catalog's) or the profile's knobs reordered renders the same engine.
A boot recorded before this release holds the digest of its argv in the profile's order: it
is compared with that form as the profile renders it now, as it rendered before its knobs
were renamed (each at its old name's place in the catalog), and in the order of every profile
the ledger recorded for the cluster (``orders``: a revision keeps its knobs in the profile's
order), so the profile's own knobs reordered since render what they rendered (``digests``).
Each form is an exact digest of the launchers rendered now: a boot matches one only if its
argv were these, the knobs' pieces in some order, which the engine does not read. A boot whose
profile's order the ledger does not hold (a revision whose knob specs this release could not
read leaves those knobs' places unknown) is set aside, as before: every release that recorded a
digest recorded its round's profile before it booted.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Iterable, Sequence
from datetime import datetime

from cluster.inventory import ClusterSpec
from cluster.launcher import render_node
from knobs.catalog import catalog
from knobs.config import Config
from knobs.errors import KnobError, ProfileError
from knobs.space import KnobSpace, render_knob
from knobs.spec import KnobSpec
from knobs.vocabulary import EventKind
from ledger import EventRecord, Ledger
from orchestrator.measurements import Measurement
from orchestrator.profile import Profile
from orchestrator.revision import Revision, revisions
from orchestrator.settings import runtime_placeholders

_KNOB_EVENTS = (EventKind.KNOB_REMOVED, EventKind.KNOB_ADDED)


def digest(profile: Profile, config: Config) -> str | None:
    """A digest of every node's launcher for ``config`` (its argv and environment), the
    machine's own paths left as their placeholders (a venv moved is the same engine), the
    knobs' pieces in an order of their own (``_canonical``: their order in the profile is no
    part of the engine); ``None`` where it cannot be rendered here. What a boot records."""
    try:
        return _digest(profile, _canonical(profile.space, config), config)
    except (ProfileError, KnobError):
        return None


def digests(
    profile: Profile, config: Config, recorded: Iterable[Sequence[str]] = ()
) -> frozenset[str] | None:
    """The digests a boot that rendered what ``config`` renders now may have recorded: this
    release's (``digest``), and an earlier release's (its argv in the knobs' order) with the
    knobs as the profile orders them now, with each knob renamed from a catalog knob at that
    knob's place (where it rendered before the rename), and in each order ``recorded`` (the
    knobs' names as a profile the ledger recorded ordered them: ``orders``), so that a
    profile whose own knobs were only reordered since renders what it rendered; ``None``
    where it cannot be rendered here. Each is the exact digest of launchers rendered now, so
    one that matches a boot's says its argv were these, in some order of the knobs' pieces,
    which the engine does not read."""
    space = profile.space
    try:
        spaces = [_canonical(space, config), space, _before_renames(profile)]
        spaces += [_ordered(space, names) for names in recorded]
        return frozenset(_digest(profile, s, config) for s in spaces)
    except (ProfileError, KnobError):
        return None


def orders(ledger: Ledger, cluster: str) -> tuple[tuple[str, ...], ...]:
    """The orders of the knobs (their names) of every profile recorded for ``cluster``
    (``revision.revisions``), each once: the orders an earlier release may have digested a
    boot's argv in (``digests``).

    Raises:
        LedgerError: the ledger failed.
    """
    seen = (tuple(k.name for k in r.knobs) for r in revisions(ledger, cluster))
    return tuple(dict.fromkeys(seen))


def _ordered(space: KnobSpace, names: Sequence[str]) -> KnobSpace:
    """``space`` with its knobs in the order of ``names`` (a recorded profile's, a knob renamed
    since at its old name's place: ``KnobSpace.renames``), those ``names`` lacks after them
    in the space's order."""
    now = [space.renames.get(n, n) for n in names]
    order = [n for n in dict.fromkeys(now) if n in space.names]
    order += [k.name for k in space.knobs if k.name not in order]
    by_name = {k.name: k for k in space.knobs}
    return space.model_copy(update={"knobs": tuple(by_name[n] for n in order)})


def _digest(profile: Profile, space: KnobSpace, config: Config) -> str:
    """The digest of every node's launcher for ``config`` with ``space``'s knobs in its order.

    Raises:
        ProfileError, KnobError: it cannot be rendered here.
    """
    runtime = {k: "{" + k + "}" for k in runtime_placeholders()}
    cluster = _placeless(profile.cluster)
    rendered = [
        render_node(profile.launcher, space, config, cluster, node, runtime)
        for node in sorted(cluster.nodes, key=lambda n: n.rank)
    ]
    text = json.dumps([[r.rank, list(r.argv), sorted(r.env.items())] for r in rendered])
    return hashlib.sha256(text.encode()).hexdigest()


def _canonical(space: KnobSpace, config: Config) -> KnobSpace:
    """``space`` with its knobs ordered by what they render at ``config`` (their flags and
    values, the JSON fields and the variables they set), not by name or place: the order a
    knob renamed or moved in the profile keeps."""

    def rendered(knob: KnobSpec) -> str:
        piece = render_knob(knob, config[knob.name])
        fields = sorted((f, sorted(v)) for f, v in piece.json_fields.items())
        return json.dumps([list(piece.argv), fields, sorted(piece.env)])

    return space.model_copy(update={"knobs": tuple(sorted(space.knobs, key=rendered))})


def _before_renames(profile: Profile) -> KnobSpace:
    """The profile's space with each knob renamed from a knob of its catalog (``renamed_from``)
    at that knob's place, as the knobs were ordered before the rename (a profile's own knobs
    come after the catalog's): the order an earlier release's digest of it was taken in."""
    space = profile.space
    moved = {k.renamed_from: k for k in space.knobs if k.renamed_from is not None}
    base = catalog(profile.knob_catalog) if profile.knob_catalog else ()
    if not any(k.name in moved for k in base):
        return space
    order = [moved.get(k.name, k).name for k in base if k.name in moved or k.name in space.names]
    order += [k.name for k in space.knobs if k.name not in order]
    by_name = {k.name: k for k in space.knobs}
    return space.model_copy(update={"knobs": tuple(by_name[n] for n in order)})


def _placeless(cluster: ClusterSpec) -> ClusterSpec:
    """``cluster`` with where its engines run left as placeholders: each node's host and
    workdir, and the ports (``port: auto`` picks a pair per folder). A folder moved, a ledger
    run from another, or a node's address changed renders the same engine; what the engine is
    told to run (its flags, its environment) is what the digest tells apart."""
    nodes = tuple(
        n.model_copy(update={"host": "{host}", "workdir": "{workdir}"}) for n in cluster.nodes
    )
    return cluster.model_copy(update={"nodes": nodes, "port": 1, "master_port": 1})


def knob_events(ledger: Ledger, cluster: str, experiment_id: int) -> list[EventRecord]:
    """The knobs dropped from or gained by champion ``experiment_id``, as recorded, oldest
    first."""
    out = [
        e
        for kind in _KNOB_EVENTS
        for e in ledger.events(cluster, kind)
        if e.detail.get("champion_experiment") == experiment_id
    ]
    return sorted(out, key=lambda e: e.id)


def legacy_cut(events: list[EventRecord]) -> datetime | None:
    """Before when a boot that recorded no rendering (before schema 9) measured another
    launcher: the latest knob the champion lost (``knob_events``), whose flag it no longer
    passes. A knob gained is not a cut for such a boot: nothing recorded says whether its
    value renders what the engine ran by default (a ledger from before this release keeps its
    champion's level, as it did)."""
    removed = [e for e in events if e.kind == EventKind.KNOB_REMOVED]
    return removed[-1].created_at if removed else None


def rendered_as(m: Measurement, now: Collection[str] | None, cut: datetime | None = None) -> bool:
    """Whether every boot of ``m`` rendered what the config renders now (``now``: its
    ``digests``; ``None``: not renderable here, every boot counts). A boot with no rendering
    recorded counts unless it started before ``cut`` (``legacy_cut``)."""
    for rendering, started in m.boots:
        if rendering is None:
            if cut is not None and started < cut:
                return False
        elif now is not None and rendering not in now:
            return False
    return True


def dropped(knob: str) -> str:
    """The words for a knob the champion lost: its flag is no longer passed."""
    return f"knob {knob} dropped, its flag no longer passed"


def gained(knob: str) -> str:
    """The words for a knob the champion gained."""
    return f"knob {knob} gained"


def revised(profile: Profile, previous: Revision | None) -> list[str]:
    """What ``profile`` changes of how configs render against the ``previous`` profile
    recorded (none recorded: nothing said), in words: the knobs dropped and gained, a knob
    rendered otherwise, the launcher edited."""
    if previous is None:
        return []
    now = {k.name: k for k in profile.space.knobs}
    was = {k.name: k for k in previous.knobs}
    # a knob renamed (``knob_renames``) is neither dropped nor gained: the knob it was before
    before = {n: was.get(n) or was.get(k.renamed_from or "") for n, k in now.items()}
    kept = {k.name for k in before.values() if k is not None}
    out = [dropped(n) for n in was if n not in kept]
    out += [gained(n) for n in now if before[n] is None and n not in previous.unread_knobs]
    out += [
        f"knob {n} renders otherwise"
        for n, b in before.items()
        if b is not None and now[n].render != b.render
    ]
    launcher = Revision.of(profile).sections.get("launcher")
    if previous.sections.get("launcher", launcher) != launcher:
        out.append("the profile's launcher changed")
    return out


def stale_line(reasons: list[str], previous: int) -> str:
    """The line a round's start and ``status`` say when the champion's measurements were of
    another rendering (``previous``: how many are set aside)."""
    why = "; ".join(reasons) or "the launcher the profile renders for it changed"
    return (
        f"the champion is measured again before any change is judged against it: its "
        f"launchers render differently now than when it was measured ({why}); its "
        f"{previous} measurement(s) and greedy texts of the old rendering stay in the ledger, "
        "set aside"
    )
