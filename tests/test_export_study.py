"""``orchestrate export --optuna-storage URL``: the ledger's decided experiments as an Optuna
study, read back with Optuna's own API (what optuna-dashboard reads), in a real SQLite storage;
a re-export adds only what is new; a knob the profile no longer has stays in the record."""

from __future__ import annotations

import json
import os
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from agents import SweepProposer
from knobs.config import Config
from knobs.spec import Value
from knobs.vocabulary import Kind, Status
from ledger import Ledger, VerdictRecord
from orchestrator.profile import load_profile
from tests.fixtures.cli import orchestrate
from tests.fixtures.profiles import twin_profile_data, write_profile
from tests.test_profile_evolution import profile_data
from tests.test_profile_evolution_under_way import round_of


def _decide(ledger: Ledger, experiment: int, status: Status, objective: float | None) -> None:
    ledger.decide(
        experiment,
        verdict=VerdictRecord(status=status, rule="test", reason="r", stats={}),
        objective=objective,
        delta_pct=None if objective is None else objective - 100.0,
        accept_len=None,
        failure_class="oom" if status == Status.CRASH else None,
    )


def test_the_decided_experiments_become_trials_and_a_re_export_adds_the_new(
    tmp_path: Path,
) -> None:
    profile = write_profile(tmp_path, twin_profile_data())
    prof = load_profile(str(profile))
    space, cluster = prof.space, prof.cluster.name
    url = f"sqlite:///{tmp_path}/orchestrate.db"
    env = {**os.environ, "ORCHESTRATE_LEDGER": url}
    base = space.default_config()
    with Ledger(url) as ledger:
        rnd = ledger.create_round(
            cluster=cluster, profile_name="twin-test", profile_digest="d", budget=4,
            proposer="optuna", approve="auto", seed=0,
        )  # fmt: skip

        def add(knob: str | None, value: object, config: Config) -> int:
            return ledger.add_experiment(
                cluster=cluster,
                round_id=rnd.id,
                kind=Kind.BASELINE if knob is None else Kind.CANDIDATE,
                config=config,
                champion_key=base.key,
                champion_objective=100.0,
                knob=knob,
                value=value,  # type: ignore[arg-type]
            ).id

        k = space.change(base, "num_speculative_tokens", 5)
        graphs = space.change(base, "cuda_graphs", not base["cuda_graphs"])
        mnbt = space.change(base, "max_num_batched_tokens", 4096)
        baseline = add(None, None, base)
        _decide(ledger, baseline, Status.KEEP, 100.0)
        # a config recorded when the profile had one more knob
        older = add("num_speculative_tokens", 5, Config({**base.apply(k), "retired_knob": 3}))
        _decide(ledger, older, Status.DISCARD, 97.5)
        crashed = add("cuda_graphs", graphs.new, base.apply(graphs))
        _decide(ledger, crashed, Status.CRASH, None)
        invalid = add("max_num_batched_tokens", 4096, base.apply(mnbt))
        _decide(ledger, invalid, Status.INVALID, 140.0)
        running = add("num_speculative_tokens", 3, base.apply(space.change(base, k.knob, 3)))

    storage = f"sqlite:///{tmp_path}/optuna.db"
    done = orchestrate(
        tmp_path, "export", "--optuna-storage", storage, "--profile", str(profile), env=env
    )
    assert done.returncode == 0, done.stderr
    assert "4 trial(s) added, 0 there already" in done.stderr
    assert not (tmp_path / "results.tsv").exists()  # no PATH: only the study

    study = optuna.load_study(study_name=cluster, storage=storage)
    assert study.direction == optuna.study.StudyDirection.MAXIMIZE
    trials = {t.user_attrs["experiment"]: t for t in study.get_trials()}
    assert set(trials) == {baseline, older, crashed, invalid}
    assert trials[baseline].state == TrialState.COMPLETE and trials[baseline].value == 100.0
    assert trials[baseline].params == dict(base)
    assert trials[older].value == 97.5 and trials[older].params["num_speculative_tokens"] == 5
    assert "retired_knob" not in trials[older].params
    assert json.loads(trials[older].user_attrs["config"])["retired_knob"] == 3
    assert trials[older].user_attrs["status"] == "discard"
    assert trials[crashed].state == TrialState.FAIL and trials[crashed].value is None
    assert trials[crashed].user_attrs["failure_class"] == "oom"
    # an invalid config's objective is fast and wrong: not a value, but kept
    assert trials[invalid].state == TrialState.FAIL
    assert trials[invalid].user_attrs["untrusted_objective"] == 140.0
    assert study.best_trial.user_attrs["experiment"] == baseline

    with Ledger(url) as ledger:
        _decide(ledger, running, Status.KEEP, 104.0)
    again = orchestrate(
        tmp_path, "export", "results.tsv", "--optuna-storage", storage, "--study", cluster,
        "--profile", str(profile), env=env,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert "1 trial(s) added, 4 there already" in again.stderr
    assert (tmp_path / "results.tsv").read_text().count("\n") == 1 + 5
    study = optuna.load_study(study_name=cluster, storage=storage)
    assert len(study.trials) == 5 and study.best_value == 104.0


@pytest.mark.parametrize("storage", ["not-a-url", "sqlite:////nonexistent/dir/optuna.db"])
def test_a_storage_that_cannot_be_opened_is_one_line(tmp_path: Path, storage: str) -> None:
    profile = write_profile(tmp_path, twin_profile_data())
    env = {**os.environ, "ORCHESTRATE_LEDGER": f"sqlite:///{tmp_path}/orchestrate.db"}
    Ledger(env["ORCHESTRATE_LEDGER"]).close()  # empty: no ledger at all is refused first
    done = orchestrate(
        tmp_path, "export", "--optuna-storage", storage, "--profile", str(profile), env=env
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: cannot open the Optuna storage")
    assert "Traceback" not in done.stderr
    # the driver's words, not SQLAlchemy's statement and the link to its documentation
    assert "sqlalche.me" not in done.stderr and "Background on this error" not in done.stderr


def test_a_minimizing_study_is_refused(tmp_path: Path) -> None:
    profile = write_profile(tmp_path, twin_profile_data())
    storage = f"sqlite:///{tmp_path}/optuna.db"
    optuna.create_study(storage=storage, study_name="latency", direction="minimize")
    env = {**os.environ, "ORCHESTRATE_LEDGER": f"sqlite:///{tmp_path}/orchestrate.db"}
    Ledger(env["ORCHESTRATE_LEDGER"]).close()  # empty: no ledger at all is refused first
    done = orchestrate(
        tmp_path, "export", "--optuna-storage", storage, "--study", "latency",
        "--profile", str(profile), env=env,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "minimizes" in done.stderr and "--study NAME" in done.stderr
    assert optuna.load_study(study_name="latency", storage=storage).trials == []


def test_trials_of_knobs_renamed_or_dropped_since_keep_the_knob_they_changed(
    tmp_path: Path,
) -> None:
    """A round moved MNBT and the KV cache's type; the profile then renamed MNBT ``mnbt``
    (``renamed_from``) and dropped the KV cache's knob. Before, every earlier trial kept only
    the knobs whose names did not change: the two changes read as the champion's own point.
    Now the MNBT change is a change of ``mnbt``, the KV change keeps its knob (of the domain
    the ledger last recorded), and the export says what it fitted."""
    mnbt, kv = "max_num_batched_tokens", "kv_cache_dtype"
    moves: list[dict[str, Value]] = [{mnbt: 4096}, {kv: "fp8_e5m2"}]
    round_of(tmp_path, profile_data(), 2, SweepProposer(moves))
    spec = load_profile(str(write_profile(tmp_path, profile_data()))).space.spec(mnbt)
    renamed = {**spec.model_dump(mode="json"), "name": "mnbt", "renamed_from": mnbt}
    now = write_profile(tmp_path, {**profile_data(renamed), "untuned": [mnbt, kv]})
    env = {**os.environ, "ORCHESTRATE_LEDGER": f"sqlite:///{tmp_path}/ledger.db"}
    storage = f"sqlite:///{tmp_path}/optuna.db"
    done = orchestrate(tmp_path, "export", "--optuna-storage", storage, "-p", str(now), env=env)
    assert done.returncode == 0, done.stderr
    study = optuna.load_study(study_name="evolving", storage=storage)
    by_knob = {t.user_attrs.get("knob"): t for t in study.trials}
    baseline = by_knob[None].params
    assert (baseline["mnbt"], baseline[kv]) == (7168, "fp8_e4m3"), baseline
    assert mnbt not in baseline
    assert by_knob[mnbt].params == {**baseline, "mnbt": 4096}
    assert by_knob[mnbt].user_attrs["renamed"] == f"{mnbt} → mnbt"
    assert by_knob[kv].params == {**baseline, kv: "fp8_e5m2"}
    line = done.stderr.strip().splitlines()[-1]
    assert line == (
        f"fitted to the profile's knobs: 3 trial(s) ran knobs renamed since ({mnbt} → mnbt): "
        f"their params take the names of now; 3 trial(s) ran knobs the profile dropped ({kv}): "
        "params of the domain the ledger last recorded for them"
    ), done.stderr
