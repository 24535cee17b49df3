"""A profile's settings as a revision records them, and what an upgrade alone changes of them.

A revision (``orchestrator.revision``) records each setting of the sections it does not say in
words of their own by its dotted key (``settings``), and a digest of each section
(``sections``); a release before the forty-eighth session's recorded the digests alone. A
release that adds a setting with a default (the forty-ninth's
``proposer.claude.api_deadline_s``) changes neither what the profile's file says nor what
runs, yet the setting is new to every record an earlier release wrote, and its section's
digest moves. Upgrading with the profile file unchanged is not a profile change:

- against a record with settings, a key it lacks whose value now is this release's default
  (``release_default``) is a setting the release added, at its default (``added_at_default``);
  a key under a setting the record has as a value of its own (``cluster.ssh: null`` then, its
  keys now) is a change;
- against a record of digests alone, a section is unchanged where its digest as the earlier
  release would have recorded it matches: without the settings added since (``ADDED``, each
  at its default now; a setting not listed here is never left out, so a list behind the code
  reads as a change, never hides one), and with the values loading resolved as they were
  recorded then (``Profile.resolved``: a release before the fiftieth session's recorded the
  workdirs and ports as resolved where the profile was loaded). A digest that matches is the
  same section in every other setting (``equivalent_sections``).

Nothing is hidden: a setting at another value than its default, a default this release moved
(the record has the key, at the old value), or a section that matches no such digest, is a
change as before.
"""

from __future__ import annotations

import hashlib
import json
import types
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel, TypeAdapter

from ledger.redact import is_secret_name
from orchestrator.profile import Profile

#: A setting as ``Revision.settings`` records it.
Setting = float | int | bool | str | None
#: A setting one revision has and the other lacks.
UNSET = object()
#: The settings each release added with a default since revisions were first recorded (the
#: release at 32ab39f), oldest first: the release, and the dotted key of each. A record of
#: digests alone is compared without those a release after its own added (at their defaults);
#: a release that adds a setting with a default adds it here (``tests/test_profile_upgrade.py``
#: fails on a key of the profile neither here nor in ``tests/fixtures/profile_keys.txt``).
ADDED: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("forty-ninth session", ("proposer.claude.api_deadline_s",)),
    ("fiftieth session", ("verdict.busy_host_stop",)),
    ("fifty-second session", ("bench.hang_after_s", "bench")),
)
#: A setting that has no default: the key leads to no field of the profile's models with one.
NO_DEFAULT = object()


def settings(key: str, value: object) -> list[tuple[str, Setting]]:
    """``value``'s settings under ``key``, each by its dotted key: a mapping's entries in turn,
    a number, a bool or a null as it is, a setting named as a secret's (``HF_TOKEN``) as
    ``secret``, nothing of it, any other value (a text, a list) as a digest."""
    if isinstance(value, dict):
        return [s for k, v in sorted(value.items()) for s in settings(f"{key}.{k}", v)]
    if is_secret_name(key.rsplit(".", 1)[-1]):
        return [(key, "secret")]
    if value is None or isinstance(value, bool | int | float):
        return [(key, value)]
    return [(key, f"digest {digest(value)}")]


def digest(value: object) -> str:
    """A short digest of a JSON value (a section's, a text setting's)."""
    text = json.dumps(value, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def same(was: object, now: object) -> bool:
    """Whether two recorded settings are the same (``True`` is not ``1``)."""
    return was == now and type(was) is type(now)


def release_default(key: str, model: type[BaseModel] | None = None) -> object:
    """This release's default of the setting at dotted ``key`` of a profile (JSON), as a
    profile that leaves it out gets it: the default of the field the key names, through the
    models above it; ``NO_DEFAULT`` where the key leads to no field with a default (a key of a
    mapping such as ``launcher.env``, a field a profile must give)."""
    model = model or Profile
    head, _, rest = key.partition(".")
    field = model.model_fields.get(head)
    if field is None:
        return NO_DEFAULT
    inner = model_of(field.annotation)
    if rest:
        return NO_DEFAULT if inner is None else release_default(rest, inner)
    if field.is_required():
        return NO_DEFAULT
    value = field.get_default(call_default_factory=True)
    return TypeAdapter(field.annotation or object).dump_python(value, mode="json")


def model_of(annotation: object) -> type[BaseModel] | None:
    """The model a field holds itself or as an optional (not in a list or a mapping)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if get_origin(annotation) in (Union, types.UnionType):
        found = [a for a in get_args(annotation) if model_of(a) is not None]
        return model_of(found[0]) if len(found) == 1 else None
    return None


def added_at_default(key: str, old: dict[str, Setting], now: Setting) -> bool:
    """Whether setting ``key``, at ``now``, is one this release added at its default, against
    ``old`` (a record's settings, which lack it): its value is the default's as recorded, and
    no key above it is a setting of ``old`` (``cluster.ssh: null`` then, a key under it now,
    is the section set, not added)."""
    parts = key.split(".")
    if key in old or any(".".join(parts[:i]) in old for i in range(1, len(parts))):
        return False
    default = release_default(key)
    if default is NO_DEFAULT:
        return False
    recorded = settings(key, default)
    return len(recorded) == 1 and recorded[0][0] == key and same(recorded[0][1], now)


def _without(dumped: dict[str, Any], keys: list[str]) -> dict[str, Any] | None:
    """``dumped`` (a profile's JSON) without the settings ``keys``, each of which must be at
    this release's default there (``None`` where one is not); a mapping they alone made up
    goes with them (a section a release added whole)."""
    out: dict[str, Any] = json.loads(json.dumps(dumped))
    for key in keys:
        parts = key.split(".")
        holders: list[dict[str, Any]] = [out]
        for part in parts[:-1]:
            below = holders[-1].get(part)
            if not isinstance(below, dict):
                break
            holders.append(below)
        if len(holders) < len(parts) or parts[-1] not in holders[-1]:
            continue  # not in this profile (under a setting it leaves at none)
        if holders[-1].pop(parts[-1]) != release_default(key):
            return None
        for depth in range(len(holders) - 1, 0, -1):
            if not holders[depth]:
                holders[depth - 1].pop(parts[depth - 1])
    return out


def as_recorded_earlier(
    dumps: tuple[dict[str, Any], ...], section: str, recorded: str | None, added: list[str]
) -> bool:
    """Whether ``recorded`` (an earlier release's digest of ``section``; ``None``: it had no
    such section) is ``section`` of one of ``dumps`` (a profile's JSON as written, and as
    loading resolved it) as that release would have recorded it: without ``added`` (the
    settings a record of settings lacks, at their defaults, ``added_at_default``) and the
    settings the releases after some release added (``ADDED``), each at its default."""
    for dumped in dumps:
        for since in range(len(ADDED) + 1):
            keys = [*added, *(k for _, keys in ADDED[since:] for k in keys)]
            earlier = _without(dumped, keys)
            if earlier is None:
                continue
            value = earlier.get(section, UNSET)
            if (digest(value) if value is not UNSET else None) == recorded:
                return True
    return False


def objective_same(old: dict[str, object], new: dict[str, object]) -> bool:
    """Whether objective ``new`` is ``old`` but for settings this release added, at their
    defaults (``added_at_default``)."""
    was, now = dict(settings("objective", old)), dict(settings("objective", new))
    return all(
        same(was.get(k, UNSET), v) or added_at_default(k, was, v) for k, v in now.items()
    ) and set(was) <= set(now)


def changed_settings(
    old: dict[str, Setting],
    new: dict[str, Setting],
    sections: list[str],
    loaded: dict[str, Setting],
) -> tuple[dict[str, list[str]], list[str]]:
    """What ``new`` changed of ``old``'s settings in ``sections``, by section and dotted key:
    ``verdict.noise.run_to_run 0.02 → 0.03`` where both values are recorded as they are, else
    ``launcher.argv changed``. And the keys this release added at their defaults
    (``added_at_default``), which are no change. ``loaded``: ``new``'s settings as loading
    resolved the profile (a release before the fiftieth session's recorded those): ``old`` at
    either value is the same."""
    out: dict[str, list[str]] = {}
    added: list[str] = []
    for key in sorted(set(old) | set(new)):
        section = key.split(".")[0]
        was, now = old.get(key, UNSET), new.get(key, UNSET)
        if section not in sections or same(was, now) or same(was, loaded.get(key, UNSET)):
            continue
        if was is UNSET and key in new and added_at_default(key, old, new[key]):
            added.append(key)
            continue
        shown = not isinstance(was, str) and not isinstance(now, str)
        phrase = f"{key} {_value(was)} → {_value(now)}" if shown else f"{key} changed"
        out.setdefault(section, []).append(phrase)
    return out, added


def _value(value: object) -> str:
    return "(unset)" if value is UNSET else json.dumps(value)
