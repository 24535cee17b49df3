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
other check of the profile against the ledger, nothing written (``check``). ``status`` says
the same line and exit, as ``round``, after what it can say of the cluster without reading it
through the other stack's profile (``recorded``): whose it is, its champion as recorded, its
rounds, whether one runs now.

A revision records the model and the catalog by name from the fifty-first session's release
on; an earlier one's are digests (``revision_settings.digest``), compared as digests, and the
catalog named where one of ``knobs.catalog.CATALOGS`` has that digest.
"""

from __future__ import annotations

from typing import Any

from knobs.catalog import CATALOGS
from knobs.errors import ProfileError
from ledger import Ledger
from orchestrator import revision
from orchestrator.profile import Profile
from orchestrator.revision_settings import digest


class AnotherStack(ProfileError):
    """A profile of another stack under the ledger's cluster name (``check``): the cluster,
    and the profile the ledger last recorded for it."""

    def __init__(self, message: str, *, cluster: str, recorded_as: str) -> None:
        super().__init__(message)
        self.cluster = cluster
        self.recorded_as = recorded_as


def check(profile: Profile, ledger: Ledger) -> None:
    """The profile serves the model, and names the catalog, that the ledger's last revision of
    its cluster did (a cluster with no revision recorded: nothing to compare).

    Raises:
        AnotherStack: another stack under the same cluster name, in one line.
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
    raise AnotherStack(
        f"the ledger {ledger.url} holds cluster {cluster} as profile {was.name} ({theirs}); "
        f"profile {profile.name} ({ours}) is another stack under the same cluster name: give "
        "it its own cluster.name, or use another ledger (ORCHESTRATE_LEDGER or the profile's "
        "ledger_url)",
        cluster=cluster,
        recorded_as=was.name,
    )


def recorded(ledger: Ledger, refused: AnotherStack) -> dict[str, Any]:
    """What ``ledger`` holds of the cluster another stack's profile was ``refused`` for, as
    recorded (its rows alone: nothing fitted to either stack's profile): the profile it last
    ran as, its rounds and experiments, its champion, its unfinished round and who holds its
    lease now (``None``: nobody, or an expired holder).

    Raises:
        LedgerError: the ledger failed.
    """
    from orchestrator.lease import state

    cluster = refused.cluster
    champion = ledger.champion(cluster)
    rounds = ledger.rounds(cluster)
    running = ledger.unfinished_round(cluster)
    lease = ledger.lease(cluster)
    return {
        "cluster": cluster,
        "profile": refused.recorded_as,
        "rounds": len(rounds),
        "experiments": len(ledger.experiments(cluster=cluster)),
        "last_round": None if not rounds else {"id": rounds[-1].id, "status": rounds[-1].status},
        "champion": None
        if champion is None
        else {
            "experiment": champion.experiment_id,
            "objective": champion.objective,
            "config": champion.config.as_dict(),
        },
        "unfinished_round": None if running is None else running.id,
        "lease": None if lease is None or state(lease) != "held" else lease.holder,
    }


def recorded_words(held: dict[str, Any], profile: str) -> list[str]:
    """``recorded``'s lines for a person, ``profile`` the profile that was refused."""
    from knobs.spec import as_text, objective_text

    lines = [
        f"cluster {held['cluster']}, as the ledger holds it (run as profile {held['profile']}, "
        f"another stack than profile {profile}'s): {held['rounds']} round(s), "
        f"{held['experiments']} experiment(s)"
    ]
    if (champion := held["champion"]) is not None:
        config = ", ".join(f"{k}={as_text(v)}" for k, v in champion["config"].items())
        lines.append(
            f"  champion: experiment #{champion['experiment']}, objective "
            f"{objective_text(champion['objective'])} ({config})"
        )
    if (last := held["last_round"]) is not None:
        lines.append(f"  last round: round {last['id']} {last['status']}")
    if held["lease"] is not None:
        lines.append(f"  held now by {held['lease']} (a round of that stack runs)")
    return lines


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
