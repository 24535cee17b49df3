"""The ledger's experiments as an Optuna study (``orchestrate export --optuna-storage``), so that
optuna-dashboard (or Optuna's own API) shows them: one trial per decided experiment, its knob
values as params, its objective as the value.

- a measured experiment (keep, discard, inconclusive) is a ``COMPLETE`` trial with its
  objective; one with no trustworthy objective (crash, invalid, vetoed) is a ``FAIL`` trial,
  as Optuna marks a trial that gave no value;
- every trial carries what the ledger says of it as user attributes: the experiment's number,
  its status, kind, changed knob and value, the change against the champion, the whole config
  (JSON), and an invalid config's (untrusted) objective;
- a knob renamed since (``renamed_from``) is a param under its name now, so a change of it
  reads as one in the study; a knob the profile dropped is a param with the domain the ledger
  last recorded for it (``retired``), so the change of it is no point of the champion's; one
  with no such record, or a value outside the knob's domain, is no param but stays in the
  config attribute (nothing the ledger recorded is lost), and the trial says so (the
  ``left_out`` attribute, and the export's line);
- exporting again adds only the experiments the study does not have (matched by number), so
  the study follows the ledger as rounds go on.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, TrialState, create_trial

from agents.optuna_proposer import distributions
from knobs.errors import KnobError
from knobs.space import KnobSpace
from knobs.spec import KnobSpec, Value, clipped, printable
from orchestrator.errors import UsageError

#: The user attribute that names a trial's experiment (how a re-export knows what it has).
EXPERIMENT_ATTR = "experiment"


@dataclass(frozen=True)
class StudyTrial:
    """One decided experiment, as the study gets it."""

    experiment: int
    config: Mapping[str, Value]
    #: the objective when it is a trustworthy measurement; ``None`` makes a failed trial
    objective: float | None
    #: what else the trial carries (status, kind, knob, value, delta_pct …), JSON-able
    attrs: Mapping[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class Exported:
    """What an export did: the study's name, the trials it added, those it had already."""

    study: str
    added: int
    present: int
    #: what the trials added had to fit to the profile's space, in words (none: nothing)
    fitted: tuple[str, ...] = ()


def export_study(
    storage: str,
    study_name: str,
    space: KnobSpace,
    trials: Sequence[StudyTrial],
    retired: Mapping[str, KnobSpec] | None = None,
) -> Exported:
    """Add ``trials`` that ``study_name`` in ``storage`` does not have yet (creating the study,
    maximizing, when there is none); ``retired``: the knobs the profile dropped, as the ledger
    last recorded them (their params' domains).

    Raises:
        UsageError: the storage cannot be opened, or the study there minimizes.
    """
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        study = optuna.create_study(
            storage=storage, study_name=study_name, direction="maximize", load_if_exists=True
        )
    except (ValueError, ImportError, optuna.exceptions.OptunaError) as e:
        raise UsageError(
            f"cannot open the Optuna storage {storage!r}: {e}; give an RDB URL such as "
            "sqlite:///optuna.db or postgresql://host/db"
        ) from e
    except Exception as e:  # SQLAlchemy's errors (a server not there, a bad driver)
        # the driver's own words, without SQLAlchemy's statement and link to its docs
        said = str(getattr(e, "orig", None) or e)
        said = re.sub(r"\(Background on this error at: [^)]*\)", "", said)
        message = clipped(" ".join(said.split()), 300)
        raise UsageError(f"cannot open the Optuna storage {storage!r}: {message}") from e
    if study.direction != optuna.study.StudyDirection.MAXIMIZE:
        raise UsageError(
            f"the Optuna study {study_name!r} in {storage!r} minimizes; orchestrate's objective "
            "is maximized: export into another study (--study NAME)"
        )
    have = {t.user_attrs.get(EXPERIMENT_ATTR) for t in study.get_trials(deepcopy=False)}
    specs = {**(retired or {}), **{k.name: k for k in space.knobs}}
    dists = {**distributions(space), **_retired_distributions(space, retired or {})}
    todo = [t for t in trials if t.experiment not in have]
    fits = [_Fit.of(t, space, specs) for t in todo]
    new = [_trial(t, fit, dists) for t, fit in zip(todo, fits, strict=True)]
    if new:
        study.add_trials(new)
    return Exported(study_name, added=len(new), present=len(trials) - len(new), fitted=_said(fits))


@dataclass(frozen=True)
class _Fit:
    """A trial's config as params of the study: the knobs renamed since under their names now
    (old name to new), those the profile dropped with their recorded domains, and what is no
    param, in words."""

    params: dict[str, Value]
    renamed: dict[str, str]
    retired: tuple[str, ...]
    left_out: tuple[str, ...]

    @classmethod
    def of(cls, trial: StudyTrial, space: KnobSpace, specs: Mapping[str, KnobSpec]) -> _Fit:
        renames = {old: new for old, new in space.renames.items() if old in trial.config}
        params: dict[str, Value] = {}
        left_out: list[str] = []
        for name, raw in space.renamed(trial.config).items():
            spec = specs.get(name)
            if spec is None:
                left_out.append(f"{name} (a knob the ledger has no record of)")
                continue
            try:
                params[name] = spec.parse(raw)
            except KnobError:
                left_out.append(f"{name}={printable(raw)} (outside its domain now)")
        retired = tuple(n for n in params if n not in space.names)
        return cls(params, renames, retired, tuple(left_out))


def _retired_distributions(
    space: KnobSpace, retired: Mapping[str, KnobSpec]
) -> dict[str, BaseDistribution]:
    """Each dropped knob's distribution, of the domain the ledger last recorded for it."""
    out: dict[str, BaseDistribution] = {}
    for name, spec in retired.items():
        if name not in space.names:
            out |= distributions(KnobSpace(knobs=(spec,)))
    return out


def _said(fits: Sequence[_Fit]) -> tuple[str, ...]:
    """What the export had to fit, a clause each: the trials whose knobs were renamed since,
    those of knobs the profile dropped, those with a param left out."""
    out: list[str] = []
    renamed = [f for f in fits if f.renamed]
    if renamed:
        names = sorted({f"{o} → {n}" for f in renamed for o, n in f.renamed.items()})
        out.append(
            f"{len(renamed)} trial(s) ran knobs renamed since ({', '.join(names)}): their "
            "params take the names of now"
        )
    retired = [f for f in fits if f.retired]
    if retired:
        names = sorted({n for f in retired for n in f.retired})
        out.append(
            f"{len(retired)} trial(s) ran knobs the profile dropped ({', '.join(names)}): "
            "params of the domain the ledger last recorded for them"
        )
    left = [f for f in fits if f.left_out]
    if left:
        names = sorted({n for f in left for n in f.left_out})
        out.append(
            f"{len(left)} trial(s) have a value that is no param ({'; '.join(names)}): kept "
            "in their config attribute, said in their left_out attribute"
        )
    return tuple(out)


def _trial(trial: StudyTrial, fit: _Fit, dists: Mapping[str, BaseDistribution]) -> FrozenTrial:
    params = fit.params
    attrs = {
        EXPERIMENT_ATTR: trial.experiment,
        **trial.attrs,
        "config": json.dumps(dict(trial.config), sort_keys=True),
    }
    if fit.renamed:
        attrs["renamed"] = ", ".join(f"{o} → {n}" for o, n in fit.renamed.items())
    if fit.left_out:
        attrs["left_out"] = "; ".join(fit.left_out)
    if trial.objective is None:
        return create_trial(
            state=TrialState.FAIL,
            params=params,
            distributions={k: dists[k] for k in params},
            user_attrs=attrs,
        )
    return create_trial(
        value=trial.objective,
        params=params,
        distributions={k: dists[k] for k in params},
        user_attrs=attrs,
    )
