"""Another stack under a cluster's name: a profile that serves another model than the one the
ledger recorded for its cluster.

A ledger keys everything by ``cluster.name``: the champion, its level, the priors, the barred
regions. A profile copied for a second stack with its cluster left unrenamed, or
``ORCHESTRATE_LEDGER`` pointing at another team's ledger, met that history as if it were an
edit of the profile that made it: its knobs read as knobs dropped and gained, and the answer
was a knob rename's advice (``new: true``), which grafts one stack onto the other's champion.

What the cluster ran is the last revision recorded for it (``revision``). The profile is
another stack where it serves another model (``model:``, the served model's name) or where
both name a knob catalog and not the same one. A profile's other edits are its own (a model
path, a launcher's flags, knobs gained or lost, a catalog's knobs written out in ``knobs:``):
``evolution``, ``knob_renames`` and ``revision`` say them. Refused in one line, before any
other check of the profile against the ledger, nothing written (``check``).

A revision records the model and the catalog by name from the fifty-first session's release
on; an earlier one's are digests (``revision_settings.digest``), compared as digests, and the
catalog named where one of ``knobs.catalog.CATALOGS`` has that digest.
"""

from __future__ import annotations

from knobs.catalog import CATALOGS
from knobs.errors import ProfileError
from ledger import Ledger
from orchestrator import revision
from orchestrator.profile import Profile
from orchestrator.revision_settings import digest


def check(profile: Profile, ledger: Ledger) -> None:
    """The profile serves the model, and names the catalog, that the ledger's last revision of
    its cluster did (a cluster with no revision recorded: nothing to compare).

    Raises:
        ProfileError: another stack under the same cluster name, in one line.
        LedgerError: the ledger failed.
    """
    cluster = profile.cluster.name
    was = revision.last(ledger, cluster)
    if was is None:
        return
    model = _model(was)
    catalog = _catalog(was)
    other_model = model is not None and model != digest(profile.model)
    named = catalog not in (None, digest(None)) and profile.knob_catalog is not None
    other_catalog = named and catalog != digest(profile.knob_catalog)
    if not (other_model or other_catalog):
        return
    theirs = ", ".join(
        [_model_words(was, profile, other_model)]
        + ([f"catalog {_catalog_name(was)}"] if catalog not in (None, digest(None)) else [])
    )
    ours = ", ".join(
        [f"model {profile.model}"]
        + ([f"catalog {profile.knob_catalog}"] if profile.knob_catalog is not None else [])
    )
    raise ProfileError(
        f"the ledger {ledger.url} holds cluster {cluster} as profile {was.name} ({theirs}); "
        f"profile {profile.name} ({ours}) is another stack under the same cluster name: give "
        "it its own cluster.name, or use another ledger (ORCHESTRATE_LEDGER or the profile's "
        "ledger_url)"
    )


def _model(was: revision.Revision) -> str | None:
    """The digest of the model ``was`` served; ``None``: not recorded (a record partly read)."""
    return digest(was.model) if was.model is not None else was.sections.get("model")


def _catalog(was: revision.Revision) -> str | None:
    """The digest of the catalog ``was`` named (``digest(None)``: none); ``None``: not
    recorded."""
    if was.model is not None:  # recorded by name, a catalog or none
        return digest(was.knob_catalog)
    return was.sections.get("knob_catalog")


def _model_words(was: revision.Revision, profile: Profile, other: bool) -> str:
    if was.model is not None:
        return f"model {was.model}"
    if other:
        return f"a model other than {profile.model}, recorded by digest"
    return f"model {profile.model}"


def _catalog_name(was: revision.Revision) -> str:
    if was.knob_catalog is not None:
        return was.knob_catalog
    recorded = was.sections.get("knob_catalog")
    known = [name for name in CATALOGS if digest(name) == recorded]
    return known[0] if known else "recorded by digest"
