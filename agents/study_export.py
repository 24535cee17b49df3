"""The ledger's experiments as an Optuna study (``orchestrate export --optuna-storage``), so that
optuna-dashboard (or Optuna's own API) shows them: one trial per decided experiment, its knob
values as params, its objective as the value.

- a measured experiment (keep, discard, inconclusive) is a ``COMPLETE`` trial with its
  objective; one with no trustworthy objective (crash, invalid, vetoed) is a ``FAIL`` trial,
  as Optuna marks a trial that gave no value;
- every trial carries what the ledger says of it as user attributes: the experiment's number,
  its status, kind, changed knob and value, the change against the champion, the whole config
  (JSON), and an invalid config's (untrusted) objective;
- a knob the profile no longer declares, or a value outside the knob's domain now, is no param
  (Optuna's distributions are the profile's) but stays in the config attribute: nothing the
  ledger recorded is lost;
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
from knobs.spec import Value, clipped
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


def export_study(
    storage: str, study_name: str, space: KnobSpace, trials: Sequence[StudyTrial]
) -> Exported:
    """Add ``trials`` that ``study_name`` in ``storage`` does not have yet (creating the study,
    maximizing, when there is none).

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
    dists = distributions(space)
    new = [_trial(t, space, dists) for t in trials if t.experiment not in have]
    if new:
        study.add_trials(new)
    return Exported(study_name, added=len(new), present=len(trials) - len(new))


def _trial(
    trial: StudyTrial, space: KnobSpace, dists: Mapping[str, BaseDistribution]
) -> FrozenTrial:
    params: dict[str, Value] = {}
    for spec in space.knobs:
        if spec.name not in trial.config:
            continue
        try:
            params[spec.name] = spec.parse(trial.config[spec.name])
        except KnobError:
            continue  # outside the knob's domain now: kept in the config attribute
    attrs = {
        EXPERIMENT_ATTR: trial.experiment,
        **trial.attrs,
        "config": json.dumps(dict(trial.config), sort_keys=True),
    }
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
