"""The profiles a cluster ran under, as the ledger records them: a revision each.

A profile may change between rounds, or between a killed round and its resume (edited, or
another ``--profile``). A round's row keeps only the digest of the profile it started under,
which tells that the profile changed, never what. So each time a round starts or resumes, or
``cluster up`` deploys, under a profile whose digest is not the last one recorded for the
cluster, its revision is recorded (a ``profile-revised`` event): its knob space (every knob's
spec, the forbidden combinations), its cells, its objective, and a digest of each of its
sections. Nothing recorded before is rewritten; a ledger written before revisions were has
none, and its first run records one.

Two revisions compared say what changed in the profile's own terms (``differences``): knobs
added or removed, a domain narrowed or widened, a default moved, forbidden combinations added
or lifted, cells added, removed or redefined (in the words the cell-redefinition check uses,
``measurements.cell_diff``), the objective, and the other sections by name. What a change does
to the champion is ``evolution``'s (``knob_changes``, which compares the current knob space
with the last revision's), to a change under way ``closures``'.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, PrivateAttr, ValidationError

from knobs.records import CellSpec
from knobs.space import ForbiddenCombination, KnobSpace
from knobs.spec import KnobSpec, as_text
from knobs.vocabulary import EventKind
from ledger import EventRecord, Ledger
from orchestrator.measurements import cell_diff
from orchestrator.profile import Profile
from orchestrator.revision_settings import (
    Setting,
    as_recorded_earlier,
    changed_settings,
    digest,
    objective_same,
    settings,
)
from orchestrator.salvage import salvaged

#: The sections ``differences`` says in words of their own (a knob space comes from the
#: catalog, ``untuned`` and ``knobs``); the others are named when their digest moved.
_IN_WORDS = frozenset(
    {"name", "knob_catalog", "untuned", "knobs", "forbidden", "cells", "objective"}
)
#: A knob spec's fields that ``differences`` says in words of their own.
_DOMAIN = frozenset({"name", "type", "low", "high", "step", "choices", "default"})


class Revision(BaseModel):
    """A profile as the ledger records it (``EventKind.PROFILE_REVISED``'s detail)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    name: str
    digest: str
    #: the model it served and the knob catalog it named (``stacks``), by name; recorded from
    #: the fifty-first session's release on (an earlier record's are its sections' digests)
    model: str | None = None
    knob_catalog: str | None = None
    #: the knob space's knobs (catalog less ``untuned``, overlaid with ``knobs:``) in full
    knobs: tuple[KnobSpec, ...]
    forbidden: tuple[ForbiddenCombination, ...] = ()
    cells: tuple[CellSpec, ...] = ()
    objective: dict[str, object] = {}
    #: a digest of each top-level section of the profile, by its name
    sections: dict[str, str] = {}
    #: each setting of the sections not said in words of their own, by its dotted key
    #: (``verdict.noise.run_to_run``): a number's, a bool's or a null's value as it is; any
    #: other value (a text, a list: a launcher's env may hold a secret) only a digest of it.
    #: Recorded from the forty-eighth session's release on (``settings_recorded``); a revision
    #: an earlier release recorded has none, and ``record`` records its settings once
    settings: dict[str, Setting] = {}
    #: the id of the event that recorded it (0: not recorded)
    event: int = 0
    #: what of the record this release could not read (a later release's fields), in words:
    #: ``knob foo's render.shape``, ``knob bar``; the rest is read (``salvaged``)
    unread: tuple[str, ...] = ()
    #: the knobs recorded whose spec could not be read at all: neither added nor removed
    unread_knobs: tuple[str, ...] = ()
    #: the profile's JSON as its file writes it and as loading resolved it (``Profile``'s
    #: ``as_written``, ``resolved``), not recorded: a revision of now (``of``) compared with
    #: one an earlier release recorded (``revision_settings``)
    _dumps: tuple[dict[str, Any], ...] = PrivateAttr(default=())

    @classmethod
    def of(cls, profile: Profile) -> Revision:
        """``profile``'s revision (not recorded)."""
        dumped = profile.as_written()
        now = cls(
            name=profile.name,
            digest=profile.digest,
            model=profile.model,
            knob_catalog=profile.knob_catalog,
            knobs=profile.space.knobs,
            forbidden=profile.space.forbidden,
            cells=profile.cells,
            objective=dumped["objective"],
            sections={k: digest(v) for k, v in sorted(dumped.items())},
            settings=_flat(dumped),
        )
        now._dumps = (dumped, profile.resolved())
        return now

    @classmethod
    def read(cls, event: EventRecord) -> Revision | None:
        """The revision ``event`` recorded. Where a later release recorded fields this one
        does not know, what it can read, and ``unread`` says what it could not; ``None`` only
        where not even its name and digest can be read."""
        try:
            return cls.model_validate({**event.detail, "event": event.id})
        except ValidationError:
            return cls._partly(event)

    @classmethod
    def _partly(cls, event: EventRecord) -> Revision | None:
        detail = event.detail
        knobs = _read(KnobSpec, detail.get("knobs"), "knob")
        forbidden = _read(ForbiddenCombination, detail.get("forbidden"), "forbidden combination")
        cells = _read(CellSpec, detail.get("cells"), "cell")
        objective, sections = detail.get("objective"), detail.get("sections")
        settings = detail.get("settings")
        readable = isinstance(settings, dict) and all(
            v is None or isinstance(v, bool | int | float | str) for v in settings.values()
        )
        try:
            return cls(
                name=detail.get("name"),
                digest=detail.get("digest"),
                model=_text(detail.get("model")),
                knob_catalog=_text(detail.get("knob_catalog")),
                knobs=tuple(knobs.read),
                forbidden=tuple(forbidden.read),
                cells=tuple(cells.read),
                objective=objective if isinstance(objective, dict) else {},
                sections=sections if isinstance(sections, dict) else {},
                **({"settings": settings} if readable else {}),
                event=event.id,
                unread=(*knobs.unread, *forbidden.unread, *cells.unread),
                unread_knobs=tuple(knobs.lost),
            )
        except ValidationError:
            return None

    @property
    def settings_recorded(self) -> bool:
        """Whether its settings were recorded: false for a revision a release before the
        forty-eighth session's recorded (its sections' digests alone)."""
        return "settings" in self.model_fields_set

    @property
    def names(self) -> list[str]:
        """Its knobs' names, in the space's order."""
        return [k.name for k in self.knobs]

    def space(self) -> KnobSpace | None:
        """Its knob space; ``None`` where the knobs no longer make one."""
        try:
            return KnobSpace(knobs=self.knobs, forbidden=self.forbidden)
        except ValueError:
            return None


M = TypeVar("M", bound=BaseModel)


@dataclass
class _Read(Generic[M]):
    """What ``_read`` read of a list of records, what it could not (in words), and the names
    of the records it could not read at all."""

    read: list[M] = field(default_factory=list)
    unread: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)


def _read(model: type[M], value: object, what: str) -> _Read[M]:
    """The ``model`` records of list ``value`` this release can read (``salvaged``); ``what``:
    the word for one of them (``knob``)."""
    out: _Read[M] = _Read()
    for raw in value if isinstance(value, list) else []:
        name = raw.get("name") if isinstance(raw, dict) else None
        label = f"{what} {name}" if isinstance(name, str) else f"a {what}"
        item, left = salvaged(model, raw)
        if item is None:
            out.unread.append(label)
            out.lost += [name] if isinstance(name, str) else []
        else:
            out.read.append(item)
            out.unread += [f"{label}'s {_and(left)}"] if left else []
    return out


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _flat(dumped: dict[str, Any]) -> dict[str, Setting]:
    """The settings of a profile's JSON that a revision records (``settings``)."""
    return {
        key: value
        for section, v in sorted(dumped.items())
        if section not in _IN_WORDS
        for key, value in settings(section, v)
    }


def _and(words: list[str]) -> str:
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"


def revisions(ledger: Ledger, cluster: str) -> list[Revision]:
    """The revisions recorded for ``cluster``, oldest first (unreadable ones left out).

    Raises:
        LedgerError: the ledger failed.
    """
    read = (Revision.read(e) for e in ledger.events(cluster, EventKind.PROFILE_REVISED))
    return [r for r in read if r is not None]


def last(ledger: Ledger, cluster: str) -> Revision | None:
    """The last profile recorded for ``cluster`` (``None``: none yet, a ledger from before
    revisions were recorded).

    Raises:
        LedgerError: the ledger failed.
    """
    recorded = revisions(ledger, cluster)
    return recorded[-1] if recorded else None


def record(ledger: Ledger, cluster: str, profile: Profile) -> Revision:
    """``profile``'s revision, recorded for ``cluster`` unless it is the last one recorded.
    The last one an earlier release recorded without its settings (``settings_recorded``) is
    recorded again, settings and all, the first time this release runs under it unchanged:
    so the next change is named by key (``differences``), not by its section.

    Raises:
        LedgerError: the ledger failed.
    """
    previous = last(ledger, cluster)
    same = previous is not None and previous.digest == profile.digest
    if previous is not None and same and previous.settings_recorded:
        return previous
    now = Revision.of(profile)
    detail = now.model_dump(mode="json", exclude={"event", "unread", "unread_knobs"})
    reason = f"ran under profile {now.name}"
    if same:
        reason += ", unchanged: its settings recorded, which an earlier release did not"
    elif previous is not None and previous.name == now.name and not differences(previous, now):
        reason += (
            ", unchanged as its file writes it: recorded as this release records it (a setting "
            "a release added since, at its default; a workdir, port or brief as written)"
        )
    event = ledger.add_event(
        cluster, EventKind.PROFILE_REVISED, subject=now.digest, detail=detail, reason=reason
    )
    return now.model_copy(update={"event": event.id})


def differences(old: Revision, new: Revision) -> list[str]:
    """What ``new`` changed of ``old``, one phrase each, in the profile's own terms."""
    out: list[str] = []
    olds = {k.name: k for k in old.knobs}
    news = {k.name: k for k in new.knobs}
    # a knob renamed (``knob_renames``): neither removed nor added
    renamed = {
        k.renamed_from: k.name
        for k in new.knobs
        if k.name not in olds and k.renamed_from in olds and k.renamed_from not in news
    }
    out += [f"knob {was} renamed {now}" for was, now in renamed.items()]
    out += [
        f"knob {k.name} added ({k.describe_domain()}, default {as_text(k.default)})"
        for k in new.knobs
        if k.name not in olds and k.name not in old.unread_knobs and k.name not in renamed.values()
    ]
    out += [
        f"knob {name} removed"
        for name in olds
        if name not in news and name not in new.unread_knobs and name not in renamed
    ]
    for name, n in news.items():
        o = olds.get(name) or olds.get(n.renamed_from or "")
        if o is not None:
            out += _knob(o, n)
    out += [
        f"forbidden combination added: {r.describe()}"
        for r in new.forbidden
        if r not in old.forbidden
    ]
    out += [f"no longer forbidden: {r.describe()}" for r in old.forbidden if r not in new.forbidden]
    was = {c.name: c for c in old.cells}
    now = {c.name: c for c in new.cells}
    renamed = {}  # a cell renamed (``cell_renames``): neither removed nor added
    for name, cell in now.items():
        before = was.get(name)
        if before is None and cell.renamed_from in was and cell.renamed_from not in now:
            before = was[cell.renamed_from]
            renamed[cell.renamed_from] = name
            out.append(f"cell {cell.renamed_from} renamed {name}")
            if not before.same_definition(cell):
                out[-1] += f" and redefined ({cell_diff(before.model_dump(), cell)})"
        elif before is None:
            out.append(f"cell {name} added")
        elif not before.same_definition(cell):
            out.append(f"cell {name} redefined ({cell_diff(before.model_dump(), cell)})")
    out += [f"cell {name} removed" for name in was if name not in now and name not in renamed]
    if not objective_same(old.objective, new.objective):
        out.append(f"objective {_words(old.objective)} → {_words(new.objective)}")
    out += _other_sections(old, new)
    unread = (*old.unread, *(u for u in new.unread if u not in old.unread))
    if unread:
        out.append(
            f"not read, as a later release recorded it: {', '.join(unread)} (the ledger keeps "
            "it as written)"
        )
    return out


def _knob(old: KnobSpec, new: KnobSpec) -> list[str]:
    """What ``new`` changed of knob ``old``: its domain (narrowed, widened), its default, and
    its other fields by name."""
    out = []
    if old.type != new.type or old.domain() != new.domain():
        was, now = set(old.domain()), set(new.domain())
        how = "narrowed" if now < was else "widened" if now > was else "changed"
        out.append(
            f"knob {new.name}'s domain {how}: {old.describe_domain()} → {new.describe_domain()}"
        )
    if old.default != new.default:
        out.append(f"knob {new.name}'s default {as_text(old.default)} → {as_text(new.default)}")
    other = [
        f
        for f, info in KnobSpec.model_fields.items()
        if f not in _DOMAIN and not info.exclude and getattr(old, f) != getattr(new, f)
    ]
    if other:
        out.append(f"knob {new.name}'s {', '.join(other)} changed")
    return out


def _other_sections(old: Revision, new: Revision) -> list[str]:
    """What ``new`` changed of ``old``'s sections not said in words of their own: each
    setting by its key, where both recorded their settings, else each section by its name.
    A section whose digest moved only by what an upgrade alone changes is none: a setting a
    later release added, at its default, or a workdir, port or path ``old`` recorded as
    loading resolved it (``revision_settings``)."""
    other = sorted(
        k
        for k in set(old.sections) | set(new.sections)
        if k not in _IN_WORDS and old.sections.get(k) != new.sections.get(k)
    )
    if not other:
        return []
    if old.settings_recorded and new.settings_recorded:
        loaded = _flat(new._dumps[1]) if len(new._dumps) > 1 else {}
        words, added = changed_settings(old.settings, new.settings, other, loaded)
        return [
            phrase
            for section in other
            if not as_recorded_earlier(new._dumps, section, old.sections.get(section), added)
            for phrase in words.get(section) or [f"{section} changed"]
        ]
    other = [k for k in other if not as_recorded_earlier(new._dumps, k, old.sections.get(k), [])]
    if not other or not old.sections:
        return []
    return [
        f"{', '.join(other)} changed (which setting{'s' if len(other) > 1 else ''} cannot "
        "be said: the release that recorded the profile then kept a digest of each section, "
        "not its settings; they are recorded from now on, and a later change is named by its "
        "key)"
    ]


def _words(objective: dict[str, object]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(objective.items())) or "(none)"


def recorded(ledger: Ledger, cluster: str, digest: str) -> Revision | None:
    """The last revision recorded for ``cluster`` whose digest is ``digest`` (a round's:
    the profile it started under); ``None``: not recorded.

    Raises:
        LedgerError: the ledger failed.
    """
    found = [r for r in revisions(ledger, cluster) if r.digest == digest]
    return found[-1] if found else None


def said(old: Revision | None, new: Revision, was: tuple[str, str]) -> str | None:
    """What changed from ``old`` to ``new``, for a line that begins "the profile changed
    since …": ``(p → q): knob foo removed; cell code-c1 redefined (concurrency 1 → 4)``;
    ``None`` where nothing did but what an upgrade alone changes (``differences``). Without
    ``old`` (not recorded: a ledger from before revisions were), the names and digests alone
    (``was``: the name and digest of then)."""
    if old is None:
        return (
            f"({was[0]} {was[1][:12]} → {new.name} {new.digest[:12]}; what it was then is not "
            "recorded: the ledger records profiles from this release on)"
        )
    what = differences(old, new)
    if not what and old.name == new.name:
        return None
    names = new.name if old.name == new.name else f"{old.name} → {new.name}"
    return f"({names}): {'; '.join(what) or 'nothing but its name'}"
