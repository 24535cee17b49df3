"""Profiles that change under a ledger: the record outlives the code.

A config in the ledger was recorded under the profile of its time. Wherever one meets the
profile of now (the champion, the history a proposer sees, a boot, ``cluster up``,
``status``) it is fitted to the current knob space by ``KnobSpace.reconcile``: a knob the
profile gained takes its default, a knob it lost is dropped. The ledger's rows stay as they
ran; what fitting the champion changed is recorded once per knob and champion as an event
(``KNOB_ADDED`` / ``KNOB_REMOVED``), with one line to show.

Keys: an experiment was decided against the champion's key of its time, so comparisons go
through ``rekeyed``, which maps every recorded config's key to the key of the same config
fitted now; a change decided under the champion before a knob was added is still decided
under it after (the champion and the change both take the knob's default).
"""

from __future__ import annotations

from collections.abc import Iterable

from knobs.space import KnobSpace, Reconciled
from knobs.spec import printable
from knobs.vocabulary import EventKind
from ledger import ChampionRecord, ExperimentRecord, Ledger

ADDED_REASON = "the profile gained the knob; the champion takes its default"
REMOVED_REASON = "the profile lost the knob; it is dropped from the champion"


def fit_champion(space: KnobSpace, champion: ChampionRecord) -> ChampionRecord:
    """The champion with its config fitted to ``space`` (the same record when it fits)."""
    fitted = space.reconcile(champion.config)
    if not fitted.added and not fitted.removed:
        return champion
    return champion.model_copy(update={"config": fitted.config})


def rekeyed(space: KnobSpace, experiments: Iterable[ExperimentRecord]) -> dict[str, str]:
    """Each recorded config's key → the key of that config fitted to ``space``."""
    return {e.config.key: space.reconcile(e.config).config.key for e in experiments}


def knob_changes(space: KnobSpace, ledger: Ledger, cluster: str, *, record: bool) -> list[str]:
    """The lines saying what fitting the cluster's champion to ``space`` changed and the
    ledger has not recorded yet; with ``record``, each is recorded now as an event (so a later
    run neither records nor shows it again). Nothing without a champion.

    Raises:
        LedgerError: the ledger failed.
    """
    champion = ledger.champion(cluster)
    if champion is None:
        return []
    fitted = space.reconcile(champion.config)
    lines: list[str] = []
    for kind, knobs in (
        (EventKind.KNOB_ADDED, fitted.added),
        (EventKind.KNOB_REMOVED, fitted.removed),
    ):
        seen = {
            e.subject
            for e in ledger.events(cluster, kind)
            if e.detail.get("champion_experiment") == champion.experiment_id
        }
        for knob in knobs:
            if knob in seen:
                continue
            lines.append(_line(kind, knob, champion, fitted))
            if record:
                _record(ledger, cluster, kind, knob, champion, fitted)
    return lines


def _line(kind: EventKind, knob: str, champion: ChampionRecord, fitted: Reconciled) -> str:
    if kind == EventKind.KNOB_ADDED:
        default = printable(fitted.config[knob])
        return f"profile gained knob {knob}: the champion takes its default {default}"
    was = printable(champion.config[knob])
    return f"knob {knob} is no longer in the profile: dropped from the champion (was {was})"


def _record(
    ledger: Ledger,
    cluster: str,
    kind: EventKind,
    knob: str,
    champion: ChampionRecord,
    fitted: Reconciled,
) -> None:
    added = kind == EventKind.KNOB_ADDED
    value = fitted.config[knob] if added else champion.config[knob]
    ledger.add_event(
        cluster,
        kind,
        subject=knob,
        detail={
            "default" if added else "value": value,
            "champion_experiment": champion.experiment_id,
        },
        reason=ADDED_REASON if added else REMOVED_REASON,
    )
