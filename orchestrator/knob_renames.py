"""A knob renamed under a ledger: the champion's value and the knob's history carry over.

The ledger's configs and changes name knobs as the profile of their time did, and a config is
fitted to the profile of now by name (``evolution``): a knob renamed read as one lost and one
gained, so the champion kept at ``chunk=4096`` deployed the new knob's default from the next
round on, and every decided value, look, prior and barred region of ``chunk`` was orphaned,
its values booted again under the new name. A knob now says what it was called
(``renamed_from: chunk`` on the knob ``mnbt``): wherever a config of the ledger is fitted
(``KnobSpace.reconcile``) the old name's value is the knob's, and wherever the history is read
by the knob a change moved (``experiments``: a proposer's history, the priors, the known-bad
regions, the verdict's looks) a change of ``chunk`` is a change of ``mnbt``. Nothing recorded
is rewritten: the rows keep the names they ran under (results.tsv, MLflow, an experiment's
words).

``renamed_from`` is checked as the profile loads (``knobs.space.renamed_clash``: not a name of
the profile's knobs, one knob each) and against the ledger (``check``, one line, exit 3, before
anything is written): it names a knob the cluster's history knows, and no experiment ran both
names side by side. A knob the profile gained while it dropped one that rendered the same flag,
JSON field or variable, where the champion's value of the dropped one is in the gained one's
domain and renders alike, is a probable rename said neither way: refused in one line, with
both ways on (``renamed_from:`` to carry the value and the history, ``new: true`` to start the
knob anew at its default). ``renamed_from`` stays in the profile while the history under the
old name matters: without it, that history is another knob's again.
"""

from __future__ import annotations

from collections.abc import Callable

from knobs.errors import KnobError, ProfileError
from knobs.space import KnobSpace, render_knob
from knobs.spec import KnobSpec, printable
from knobs.vocabulary import Kind
from ledger import ExperimentRecord, Ledger, ProposalRecord

# ``evolution`` imports this module: read as ``evolution.Lineage`` when called, never at import
from orchestrator import evolution, revision, stacks
from orchestrator.profile import Profile


def experiment(space: KnobSpace, e: ExperimentRecord) -> ExperimentRecord:
    """``e`` with the knobs its change moved under their names now (the same record where
    none was renamed). Its config stays as recorded (its key is the ledger's); it is fitted,
    renames and all, by ``KnobSpace.reconcile``."""
    renames = space.renames
    knob = renames.get(e.knob or "", e.knob)
    coupled = renames.get(e.coupled_knob or "", e.coupled_knob)
    if knob == e.knob and coupled == e.coupled_knob:
        return e
    return e.model_copy(update={"knob": knob, "coupled_knob": coupled})


def proposal(space: KnobSpace, p: ProposalRecord) -> ProposalRecord:
    """Proposal ``p`` (one not yet booted: a round resumed under the profile renamed) with
    its knobs under their names now, so that it runs as proposed rather than being closed as a
    change of a knob the profile lost."""
    renames = space.renames
    knob = renames.get(p.knob, p.knob)
    coupled = renames.get(p.coupled_knob or "", p.coupled_knob)
    if knob == p.knob and coupled == p.coupled_knob:
        return p
    return p.model_copy(update={"knob": knob, "coupled_knob": coupled})


def experiments(
    space: KnobSpace, ledger: Ledger, *, cluster: str | None = None, round_id: int | None = None
) -> list[ExperimentRecord]:
    """The ledger's experiments (``Ledger.experiments``), each change under its knob's name
    now (``experiment``) and against its champion's key now (``evolution.Lineage``: the
    champion it was proposed against, fitted, renames and all): what counts a knob's looks
    and decisions by the champion they were made under (``priors.distinct``, the step cost's
    champions) counts a look recorded under the knob's old name, against the champion's
    config under that name, as one under the champion of now. A baseline keeps its recorded
    key.

    Raises:
        LedgerError: the ledger failed.
    """
    recorded = ledger.experiments(cluster=cluster, round_id=round_id)
    by_id = {e.id: e for e in recorded}
    lineages: dict[str, evolution.Lineage] = {}
    out: list[ExperimentRecord] = []
    for e in recorded:
        e = experiment(space, e)
        if e.kind == Kind.CANDIDATE:
            lineage = lineages.get(e.cluster)
            if lineage is None:
                champions = (c.experiment_id for c in ledger.champion_history(e.cluster))
                lineage = evolution.Lineage(space, champions, _reader(ledger, by_id))
                lineages[e.cluster] = lineage
            key = lineage.champion_key(e)
            if key and key != e.champion_key:
                e = e.model_copy(update={"champion_key": key})
        out.append(e)
    return out


def _reader(
    ledger: Ledger, known: dict[int, ExperimentRecord]
) -> Callable[[int], ExperimentRecord | None]:
    """An experiment by id: one of ``known`` (read already), else the ledger's."""
    return lambda i: known.get(i) or ledger.experiment(i)


def retired(profile: Profile, ledger: Ledger) -> dict[str, KnobSpec]:
    """The knobs the cluster's recorded profiles had that ``profile`` dropped (neither its
    knob nor renamed to one), each as last recorded: what a config of the ledger ran them at
    means (the Optuna export's params of them).

    Raises:
        LedgerError: the ledger failed.
    """
    space = profile.space
    out: dict[str, KnobSpec] = {}
    for recorded in revision.revisions(ledger, profile.cluster.name):
        out.update({k.name: k for k in recorded.knobs})
    return {n: k for n, k in out.items() if n not in space.names and n not in space.renames}


def check(profile: Profile, ledger: Ledger) -> None:
    """Each knob's ``renamed_from`` names a knob the cluster's history knows, never run side by
    side with it; and no knob gained is a knob dropped renamed without saying which
    (``_unsaid``).

    Raises:
        ProfileError: one that is not so, or the profile another stack than the cluster's
            (``stacks.check``), in one line: what, where, what to do.
        LedgerError: the ledger failed.
    """
    # another stack under the cluster's name is no edit of the profile that ran it: said as
    # such, before any knob is taken for one renamed (``stacks``)
    stacks.check(profile, ledger)
    cluster = profile.cluster.name
    declared = [k for k in profile.space.knobs if k.renamed_from is not None]
    previous = revision.last(ledger, cluster)
    if declared:
        recorded = ledger.experiments(cluster=cluster)
        known = {k for e in recorded for k in e.config}
        known |= {k for r in revision.revisions(ledger, cluster) for k in r.names}
        for knob in declared:
            was = knob.renamed_from
            assert was is not None
            said = f"profile {profile.name}: knob {knob.name} says renamed_from: {was}"
            if was not in known:
                names = ", ".join(sorted(known)) or "none"
                raise ProfileError(
                    f"{said}, a knob the ledger never knew on cluster {cluster} (its knobs: "
                    f"{names}): write the name its history was recorded under, or take "
                    f"renamed_from out to start {knob.name} as a new knob"
                )
            both = next((e.id for e in recorded if {was, knob.name} <= set(e.config)), None)
            if both is not None:
                raise ProfileError(
                    f"{said}, but experiment #{both} ran both, side by side: {knob.name} is "
                    f"not {was} renamed; take renamed_from out"
                )
    if previous is not None:
        _unsaid(profile, ledger, previous)


def _unsaid(profile: Profile, ledger: Ledger, previous: revision.Revision) -> None:
    """A knob the profile gained (since ``previous``, the last revision recorded) that renders
    what a knob it dropped rendered, where the champion's value of the dropped one is in the
    gained one's domain: a rename said neither way (``renamed_from:``, ``new: true``).

    Raises:
        ProfileError: the first such knob, in one line.
        LedgerError: the ledger failed.
    """
    space = profile.space
    cluster = profile.cluster.name
    dropped = [
        k for k in previous.knobs if k.name not in space.names and k.name not in space.renames
    ]
    gained = [
        k
        for k in space.knobs
        if k.name not in previous.names
        and k.name not in previous.unread_knobs
        and k.renamed_from is None
        and not k.new
    ]
    if not dropped or not gained:
        return
    champion = ledger.champion(cluster)
    if champion is None:
        return
    for knob in gained:
        for gone in dropped:
            target = _same_target(gone, knob)
            if target is None or gone.name not in champion.config:
                continue
            value = champion.config[gone.name]
            try:
                same = render_knob(knob, knob.parse(value)) == render_knob(gone, value)
            except KnobError:
                continue  # the gained knob's domain lacks the champion's value: not the same
            if not same:
                continue  # it renders the value otherwise (``render.values``): another setting
            raise ProfileError(
                f"profile {profile.name}: knob {knob.name} renders {target} as the dropped knob "
                f"{gone.name} did: say `renamed_from: {gone.name}` on {knob.name} to carry its "
                f"value {printable(value)} in the champion and its history, or `new: true` if "
                f"{knob.name} is a new knob (the champion then takes its default "
                f"{printable(knob.default)})"
            )


def _same_target(a: KnobSpec, b: KnobSpec) -> str | None:
    """What both ``a`` and ``b`` render (a flag, a JSON flag's field, a variable), in words;
    ``None``: nothing in common."""
    common = [t for t in _targets(a) if t in _targets(b)]
    return common[0] if common else None


def _targets(knob: KnobSpec) -> list[str]:
    how = knob.render
    if how.kind == "flag":
        return [str(how.flag)]
    if how.kind == "json_field":
        return [f"{how.field} in {how.flag}"]
    if how.kind == "env":
        return [f"${how.env}"]
    tokens = [t for t in (*how.when_true, *how.when_false) if t.startswith("-")]
    return [*tokens, *(f"${name}" for name in {**how.env_when_true, **how.env_when_false})]
