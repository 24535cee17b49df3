"""Profiles that change under a ledger: the record outlives the code.

A config in the ledger was recorded under the profile of its time. Wherever one meets the
profile of now (the champion, the history a proposer sees, a boot, ``cluster up``,
``status``, the report) it is fitted to the current knob space (``Lineage``,
``KnobSpace.reconcile``): a knob it lost is dropped; a knob it lacks takes its value in the
champion the change was proposed against (its parent, fitted likewise), else (a baseline, or
a knob no ancestor had) its default. So a change recorded while a knob was out of the profile
moves, once the knob is back, its own knob and no other: the knob is its champion's, not its
default. The ledger's rows stay as they ran; what fitting the champion changed is recorded
once per knob and champion as an event (``KNOB_ADDED`` / ``KNOB_REMOVED``), with one line to
show. A knob gained at its default (one taken off ``untuned:``, say) ran until then at the
launcher's own flag or the engine's default, which the ledger does not know (a launcher's
argv is recorded as a digest): the line says so, and that the knob's default under ``knobs:``
is where the champion starts.

Keys: an experiment was decided against the champion of its time, so comparisons go through
``Lineage.champion_key``, the key of that champion fitted now; a change decided under the
champion before a knob was added (or while it was out of the profile) is still decided under
it after.

A champion fitted is a config that has not run: a knob the profile lost leaves the engine at
its own default, a knob it gained sets the knob's default. When the champion, which booted
before, then fails its boots as a config fails and never came up as the profile renders it
now, the profile's change explains it, not the cluster (``refit_blame``): the round stops with
the profile's exit code and the line names the knob and the ways back.

A change of a knob the profile lost, or of a value outside a domain it narrowed, cannot run:
``orchestrator.closures`` closes it when the round takes it up.

A profile may narrow a knob's domain under a champion whose value it leaves out. The champion
keeps it: it was measured there, and a verdict needs the config that ran. Every round says so
as it starts, and ``status`` too (``outside_domain``); the proposers move the knob only into the
domain, and the changes of other knobs keep the champion's value.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import NamedTuple

from knobs.catalog import catalog
from knobs.config import Config
from knobs.errors import KnobError
from knobs.space import KnobSpace, Reconciled
from knobs.spec import KnobSpec, Value, as_text, printable
from knobs.vocabulary import BootStatus, EventKind, Kind
from ledger import ChampionRecord, ExperimentRecord, Ledger
from orchestrator import knob_renames, revision
from orchestrator.profile import Profile

ADDED_REASON = "the profile gained the knob; the champion takes its default"
INHERITED_REASON = (
    "the profile gained the knob back; the champion takes it from the champion it was changed from"
)
RESTORED_REASON = "the profile gained the knob back; the champion takes it as it ran it"
REMOVED_REASON = "the profile lost the knob; it is dropped from the champion"


class Lineage:
    """A cluster's experiments fitted to a knob space, each change from its parent: the
    champion it was proposed against.

    A change records its parent as it is recorded (``parent_experiment_id``, schema 8). A
    change an older release recorded has none stored, and its parent is inferred: a cluster
    runs one experiment at a time (the lease), and a change is recorded against the champion
    of the moment, so its parent is the last champion kept before it was recorded, the
    champion row of the largest experiment id below its own. A baseline has none."""

    def __init__(
        self,
        space: KnobSpace,
        champions: Iterable[int],
        experiment: Callable[[int], ExperimentRecord | None],
    ) -> None:
        """``champions``: the experiment ids of the cluster's champion history;
        ``experiment``: an experiment of the cluster by id."""
        self.space = space
        self._champions = sorted(set(champions))
        self._experiment = experiment
        self._fitted: dict[int, Reconciled] = {}

    @classmethod
    def read(
        cls, space: KnobSpace, ledger: Ledger, cluster: str, experiments: Sequence[ExperimentRecord]
    ) -> Lineage:
        """The lineage of ``cluster``'s ``experiments`` (all of them: parents are looked up
        among them).

        Raises:
            LedgerError: the ledger failed.
        """
        by_id = {e.id: e for e in experiments}
        return cls(space, (c.experiment_id for c in ledger.champion_history(cluster)), by_id.get)

    @classmethod
    def lazy(cls, space: KnobSpace, ledger: Ledger, cluster: str) -> Lineage:
        """The lineage of ``cluster``, its experiments read from the ledger one by one as
        they are needed (a few ancestors of one experiment).

        Raises:
            LedgerError: the ledger failed.
        """
        champions = (c.experiment_id for c in ledger.champion_history(cluster))
        return cls(space, champions, ledger.experiment)  # every champion's experiment is there

    def parent(self, e: ExperimentRecord) -> ExperimentRecord | None:
        """The champion (its experiment) that change ``e`` was proposed against; ``None`` for
        a baseline."""
        if e.kind != Kind.CANDIDATE:
            return None
        if e.parent_experiment_id is not None:
            stored = self._experiment(e.parent_experiment_id)
            if stored is not None:
                return stored
        at = bisect_left(self._champions, e.id)
        return None if at == 0 else self._experiment(self._champions[at - 1])

    def fit(self, e: ExperimentRecord) -> Reconciled:
        """``e``'s config fitted to the space: a knob it lacks from its parent, fitted (a
        baseline's, or one no ancestor had, its default); one the space lacks dropped."""
        chain: list[ExperimentRecord] = []
        at: ExperimentRecord | None = e
        while at is not None and at.id not in self._fitted:
            chain.append(at)
            if all(k in self.space.renamed(at.config) for k in self.space.names):
                break  # fits without its parent
            at = self.parent(at)
        for x in reversed(chain):  # parents first
            parent = self.parent(x) if x is not at else None
            base = None if parent is None else self._fitted[parent.id].config
            self._fitted[x.id] = self.space.reconcile(x.config, base)
        return self._fitted[e.id]

    def origin(self, e: ExperimentRecord, knob: str) -> int | None:
        """The experiment whose recorded config ``e``'s fitted value of ``knob`` comes from
        (``e``'s own, or an ancestor's); ``None``: the knob's default."""
        at: ExperimentRecord | None = e
        while at is not None and knob not in at.config:
            at = self.parent(at)
        return None if at is None else at.id

    def champion_key(self, e: ExperimentRecord) -> str:
        """The key, fitted now, of the champion ``e`` was decided against (its parent's); a
        baseline's recorded ``champion_key`` (none: empty)."""
        parent = self.parent(e)
        return (e.champion_key or "") if parent is None else self.fit(parent).config.key


def fit(space: KnobSpace, ledger: Ledger, e: ExperimentRecord) -> Reconciled:
    """Experiment ``e``'s config fitted to ``space`` (``Lineage.fit``); the ledger is read
    only when it lacks a knob of the space.

    Raises:
        LedgerError: the ledger failed.
    """
    fitted = space.reconcile(e.config)
    if not fitted.added or e.kind != Kind.CANDIDATE:
        return fitted
    return Lineage.lazy(space, ledger, e.cluster).fit(e)


def fit_champion(space: KnobSpace, ledger: Ledger, champion: ChampionRecord) -> ChampionRecord:
    """The champion with its config fitted to ``space`` (the same record when it fits).

    Raises:
        LedgerError: the ledger failed.
    """
    fitted = space.reconcile(champion.config)
    if fitted.config.key == champion.config.key:  # fits (none lost, gained or renamed)
        return champion
    if fitted.added:
        fitted = fit(space, ledger, ledger.experiment(champion.experiment_id))
    return champion.model_copy(update={"config": fitted.config})


def knob_changes(space: KnobSpace, ledger: Ledger, cluster: str, *, record: bool) -> list[str]:
    """The lines saying what fitting the cluster's champion to ``space`` changed and the
    ledger has not recorded yet; with ``record``, each is recorded now as an event (so a later
    run neither records nor shows it again). Nothing without a champion.

    The knobs the profile gained and lost are those of ``space`` against the last profile
    recorded for the cluster (``revision.last``): a knob dropped and put back is said and
    recorded both ways, though the champion's row carries it throughout. A ledger with no
    profile recorded (written before revisions were) is compared by the champion's row.

    Raises:
        LedgerError: the ledger failed.
    """
    champion = ledger.champion(cluster)
    if champion is None:
        return []
    renamed = space.renames  # a knob renamed (``knob_renames``) is neither gained nor lost
    fitted = space.reconcile(champion.config)
    previous = revision.last(ledger, cluster)
    lineage = Lineage.lazy(space, ledger, cluster)
    experiment = ledger.experiment(champion.experiment_id)
    if previous is None:
        added, removed, was = fitted.added, fitted.removed, dict(champion.config)
    else:
        # a knob a later release recorded and this one cannot read was not gained
        added = [
            k
            for k in space.names
            if k not in (*previous.names, *previous.unread_knobs)
            and space.spec(k).renamed_from not in previous.names
        ]
        removed = [k for k in previous.names if k not in space.names and k not in renamed]
        was = {**_fitted(previous, ledger, cluster, experiment), **champion.config}
    if added:  # each as the champion ran it, else from the champion it was changed from
        fitted = lineage.fit(experiment)
    origins = {k: lineage.origin(experiment, k) for k in added}
    lines: list[str] = []
    for kind, knobs in ((EventKind.KNOB_ADDED, added), (EventKind.KNOB_REMOVED, removed)):
        seen = {  # since the last profile recorded: a kill between these and its record
            e.subject
            for e in ledger.events(cluster, kind)
            if e.detail.get("champion_experiment") == champion.experiment_id
            and (previous is None or e.id > previous.event)
        }
        for knob in knobs:
            if knob in seen:
                continue
            origin = origins.get(knob)
            value = fitted.config[knob] if kind == EventKind.KNOB_ADDED else was[knob]
            lines.append(_line(space, kind, knob, champion, value, origin))
            if record:
                _record(ledger, cluster, kind, knob, champion, value, origin)
    return lines


def record_profile(profile: Profile, ledger: Ledger) -> list[str]:
    """What the profile changed in the champion (``knob_changes``), recorded, then the
    profile itself (``revision.record``): the lines to show.

    Raises:
        ProfileError: a knob renamed unsaid, or ``renamed_from`` naming no knob of the ledger's
            (``knob_renames.check``).
        LedgerError: the ledger failed.
    """
    cluster = profile.cluster.name
    knob_renames.check(profile, ledger)  # a knob renamed unsaid: refused before any record
    lines = knob_changes(profile.space, ledger, cluster, record=True)
    revision.record(ledger, cluster, profile)
    return lines


def _fitted(
    previous: revision.Revision, ledger: Ledger, cluster: str, e: ExperimentRecord
) -> dict[str, Value]:
    """``e``'s config fitted to the ``previous`` profile's knob space (one that no longer makes
    a space: its knobs' defaults)."""
    space = previous.space()
    if space is None:
        return {k.name: k.default for k in previous.knobs}
    return dict(Lineage.lazy(space, ledger, cluster).fit(e).config)


def _line(
    space: KnobSpace,
    kind: EventKind,
    knob: str,
    champion: ChampionRecord,
    value: Value,
    origin: int | None,
) -> str:
    shown = printable(value)
    if kind == EventKind.KNOB_REMOVED:
        return f"knob {knob} is no longer in the profile: dropped from the champion (was {shown})"
    if origin is None:
        return (
            f"profile gained knob {knob}: the champion takes its default {shown}, where its "
            f"engine ran {_as_launched(space.spec(knob))} (or the engine's default) until now; "
            "to start from another value, give it as the knob's default under knobs: "
            f"({{name: {knob}, default: VALUE}})"
        )
    if origin == champion.experiment_id:
        return (
            f"profile gained knob {knob} back: the champion takes {shown} again, as it ran it "
            f"(experiment #{origin})"
        )
    return (
        f"profile gained knob {knob}: the champion takes {shown}, as the champion it was "
        f"changed from ran it (experiment #{origin}), not its default "
        f"{printable(space.spec(knob).default)}"
    )


def _as_launched(spec: KnobSpec) -> str:
    """Where a launcher sets what knob ``spec`` renders, while the profile does not tune it:
    ``the launcher's own --kv-cache-dtype``."""
    how = spec.render
    if how.kind == "flag":
        return f"the launcher's own {how.flag}"
    if how.kind == "json_field":
        return f"the launcher's own {how.field} in {how.flag}"
    if how.kind == "env":
        return f"the launcher's own ${how.env}"
    tokens = [*how.when_true, *how.when_false, *how.env_when_true, *how.env_when_false]
    return f"the launcher's own {' or '.join(tokens)}" if tokens else "the launcher's own flags"


def _record(
    ledger: Ledger,
    cluster: str,
    kind: EventKind,
    knob: str,
    champion: ChampionRecord,
    value: Value,
    origin: int | None,
) -> None:
    added = kind == EventKind.KNOB_ADDED
    detail: dict[str, object] = {"default" if added and origin is None else "value": value}
    if added and origin is not None:
        detail["from_experiment"] = origin
    detail["champion_experiment"] = champion.experiment_id
    reason = (
        REMOVED_REASON
        if not added
        else ADDED_REASON
        if origin is None
        else RESTORED_REASON
        if origin == champion.experiment_id
        else INHERITED_REASON
    )
    ledger.add_event(cluster, kind, subject=knob, detail=detail, reason=reason)


class RefitBlame(NamedTuple):
    """Why a champion fitted to the profile fails where it booted before (``refit_blame``)."""

    #: what the profile changed in the champion's config, in words
    what: str
    #: the ways back, in words
    todo: str
    #: the knobs the profile lost, each with the champion's value
    removed: dict[str, Value]
    #: the knobs the profile gained, each with the default the champion takes
    added: dict[str, Value]

    def line(self, failed: str, left: str | None = None) -> str:
        """The one line of a stop it explains: ``failed``, how the champion failed (``the
        champion (experiment #3) failed …``); ``left``, what the stop leaves as it was (a
        round's change under way)."""
        kept = "" if left is None else f"; {left}"
        return f"{failed}: {self.what}{kept}: {self.todo}, and run the same command again"


def refit_blame(profile: Profile, ledger: Ledger, champion: ExperimentRecord) -> RefitBlame | None:
    """The profile's change that explains why ``champion`` (its experiment, config as
    recorded), which booted before, failed its boots for a config's reasons: the knobs the
    profile lost (the engine now runs at its own default) or gained (the champion now takes
    the knob's default, or its parent's value: ``fit``) since it was measured, when no boot of
    it as the profile renders it now ever came up. ``None``: the profile changed none of its
    knobs, or the champion came up as it is now booted (the cluster changed, not the config).

    Raises:
        LedgerError: the ledger failed.
    """
    fitted = fit(profile.space, ledger, champion)
    if not fitted.added and not fitted.removed:
        return None
    key = fitted.config.key
    if any(
        b.config_key == key and b.status != BootStatus.FAILED for b in ledger.boots(champion.id)
    ):
        return None
    removed = {k: champion.config[k] for k in fitted.removed}
    added = {k: fitted.config[k] for k in fitted.added}
    what: list[str] = []
    todo: list[str] = []
    if removed:
        names = ", ".join(removed)
        were = ", ".join(printable(v) for v in removed.values())
        one = len(removed) == 1
        what.append(
            f"knob{'' if one else 's'} {names}, which the profile no longer has, "
            f"{'was' if one else 'were'} {were} in it, and without "
            f"{'it' if one else 'them'} the engine runs at its own default"
        )
        untuned = [k for k in removed if k in profile.untuned]
        out = f" (take {'it' if one else 'them'} out of untuned:)" if untuned else ""
        todo.append(
            f"put {names} back in profile {profile.name}{out}, or set "
            f"{_in_launcher(profile, removed)} in its launcher"
        )
    if added:
        names = ", ".join(added)
        one = len(added) == 1
        defaults = ", ".join(f"{k}={printable(v)}" for k, v in added.items())
        what.append(
            f"knob{'' if one else 's'} {names}, which the profile gained, "
            f"set{'s' if one else ''} the champion's {defaults}"
        )
        todo.append(
            f"give {names} the default{'' if one else 's'} the champion's engine ran at, or "
            f"take {'it' if one else 'them'} out of profile {profile.name}"
        )
    return RefitBlame("; ".join(what), "; ".join(todo), removed, added)


def _in_launcher(profile: Profile, values: dict[str, Value]) -> str:
    """``values`` of knobs the profile lost, as its catalog renders them (``--flag 0.85``), or
    in words where the profile's catalog does not know the knob."""
    specs = {k.name: k for k in catalog(profile.knob_catalog)} if profile.knob_catalog else {}
    words: list[str] = []
    for name, value in values.items():
        spec = specs.get(name)
        try:
            rendered = (
                None if spec is None else KnobSpace(knobs=(spec,)).render(Config({name: value}))
            )
        except KnobError:  # a value its catalog's rendering does not map
            rendered = None
        if rendered is None:
            words.append(f"{name}'s {printable(value)} as it rendered")
            continue
        shown = [" ".join(rendered.argv)] if rendered.argv else []
        shown += [
            f"{field} {as_text(v)} in {flag}"
            for flag, fields in rendered.json_fields.items()
            for field, v in fields.items()
        ]
        shown += [f"{env}={v}" for env, v in rendered.env.items()]
        words.append(", ".join(shown) or f"{name}'s {printable(value)} as it rendered")
    return ", ".join(words)


def outside_domain(space: KnobSpace, config: Mapping[str, Value]) -> dict[str, str]:
    """Each knob of ``space`` whose value in ``config`` (the champion, fitted) the profile's
    domain no longer has (it narrowed the knob's values or range since), with its line."""
    lines: dict[str, str] = {}
    for spec in space.knobs:
        if spec.name not in config:
            continue
        value = config[spec.name]
        try:
            spec.parse(value)
        except KnobError:
            lines[spec.name] = (
                f"the champion's {spec.name} {as_text(value)} is outside the profile's domain "
                f"now ({spec.describe_domain()}): the champion keeps it (it was measured "
                f"there); a change of {spec.name} moves it into the domain, the other knobs' "
                "changes keep it"
            )
    return lines
