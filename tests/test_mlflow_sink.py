"""ledger.mlflow_sink against a real MLflow sqlite store (each test its own, already migrated)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from mlflow.entities import Run
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from mlflow.utils import validation
from sqlalchemy.exc import OperationalError

from ledger import mlflow_sink, mlflow_values
from ledger.mlflow_open import open_store
from ledger.mlflow_sink import MlflowSink, MlflowSinkError
from orchestrator.errors import OrchestrateError
from tests.fixtures.mlflow_store import MlflowStore

ANTHROPIC_KEY = "sk-ant-api03-Zq7fK2mNv8Lw3XpR9sTb4YcH6jD1eG5uA0oI"
HF_TOKEN = "hf_QwErTyUiOpAsDfGhJkLzXcVbNm123456"
DB_PASSWORD = "Pa55w0rd!x"


@pytest.fixture
def client(mlflow_db: MlflowStore) -> MlflowClient:
    return MlflowClient(tracking_uri=mlflow_db.tracking_uri)


def _text(client: MlflowClient, run_id: str, path: str, tmp_path: Path) -> str:
    local = client.download_artifacts(run_id, path, dst_path=str(tmp_path / "download"))
    return Path(local).read_text(encoding="utf-8")


def _artifact_paths(client: MlflowClient, run_id: str, path: str | None = None) -> set[str]:
    found: set[str] = set()
    for info in client.list_artifacts(run_id, path):
        if info.is_dir:
            found |= _artifact_paths(client, run_id, info.path)
        else:
            found.add(info.path)
    return found


def test_a_round_with_two_experiments(
    mlflow_db: MlflowStore, client: MlflowClient, tmp_path: Path
) -> None:
    sink = MlflowSink()
    assert sink.tracking_uri == mlflow_db.tracking_uri
    round_run = sink.start_round(
        round_id=7, cluster="twin", params={"budget": "6", "proposer": "optuna"}
    )
    first = sink.start_experiment(
        parent_run_id=round_run,
        number=1,
        kind="candidate",
        params={
            "gpu_memory_utilization": 0.9,
            "enforce_eager": True,
            "max_num_seqs": 64,
            "speculative_config": {"num_speculative_tokens": 4, "method": "dflash"},
            "description": "more draft tokens",
        },
        tags={"hypothesis": "fewer verifier steps"},
    )
    second = sink.start_experiment(
        parent_run_id=round_run, number=2, kind="confirmation", params={"max_num_seqs": 128}
    )
    sink.log_metrics(first, {"decode_tok_s": 101.5, "ttft_ms_p50": 80.0}, step=0)
    sink.log_metrics(first, {"decode_tok_s": 103.25}, step=1)
    sink.log_texts(first, {"launchers/node-0.sh": "vllm serve m\n", "cells.json": "[1, 2]"})
    log = tmp_path / "node-3.log"
    log.write_text("INFO booted\n", encoding="utf-8")
    sink.log_files(first, {"logs": log, "": log})
    sink.finish(first)
    sink.finish(second, "FAILED")
    sink.rename(second, "exp-2 · num_speculative_tokens 7→5 · crash")
    sink.finish(round_run)

    parent = client.get_run(round_run)
    assert parent.info.run_name == "round-7"
    assert parent.info.status == "FINISHED"
    assert parent.data.params == {"budget": "6", "proposer": "optuna"}
    assert parent.data.tags["orchestrate.round"] == "7"
    assert parent.data.tags["orchestrate.cluster"] == "twin"
    assert parent.info.artifact_uri.startswith(mlflow_db.artifact_root.as_uri())
    # MLflow 3's UI opens it on its runs table, not on traces
    experiment = client.get_experiment(parent.info.experiment_id)
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"

    child: Run = client.get_run(first)
    assert child.info.run_name == "exp-1"
    assert child.info.experiment_id == parent.info.experiment_id
    assert child.data.tags["mlflow.parentRunId"] == round_run
    assert child.data.tags["orchestrate.kind"] == "candidate"
    assert child.data.tags["orchestrate.round"] == "7"
    assert child.data.tags["hypothesis"] == "fewer verifier steps"
    assert child.data.params == {
        "gpu_memory_utilization": "0.9",
        "enforce_eager": "true",
        "max_num_seqs": "64",
        "speculative_config": '{"method": "dflash", "num_speculative_tokens": 4}',
        "description": "more draft tokens",
    }
    history = client.get_metric_history(first, "decode_tok_s")
    assert [(m.step, m.value) for m in history] == [(0, 101.5), (1, 103.25)]
    assert child.data.metrics["ttft_ms_p50"] == 80.0
    assert _artifact_paths(client, first) == {
        "launchers/node-0.sh",
        "cells.json",
        "logs/node-3.log",
        "node-3.log",
    }
    assert _text(client, first, "launchers/node-0.sh", tmp_path) == "vllm serve m\n"
    assert json.loads(_text(client, first, "cells.json", tmp_path)) == [1, 2]
    assert _text(client, first, "logs/node-3.log", tmp_path) == "INFO booted\n"
    assert client.get_run(second).info.status == "FAILED"
    assert client.get_run(second).info.run_name == "exp-2 · num_speculative_tokens 7→5 · crash"

    assert sink.runs_of_round(round_run) == [first, second]
    other = sink.start_round(round_id=8, cluster="twin", params={})
    assert sink.runs_of_round(other) == []


def test_a_second_sink_resumes_the_same_runs(mlflow_db: MlflowStore, client: MlflowClient) -> None:
    before = MlflowSink()
    round_run = before.start_round(round_id=1, cluster="twin", params={"budget": "2"})
    first = before.start_experiment(
        parent_run_id=round_run, number=1, kind="candidate", params={"max_num_seqs": 64}
    )
    before.log_metrics(first, {"decode_tok_s": 10.0}, step=0)
    # the process dies here; a new one opens the same store and carries on
    after = MlflowSink()
    assert after.experiment_id == before.experiment_id
    after.log_metrics(first, {"decode_tok_s": 11.0}, step=1)
    after.set_tags(first, {"verdict": "keep"})
    after.finish(first)
    second = after.start_experiment(
        parent_run_id=round_run, number=2, kind="candidate", params={"max_num_seqs": 96}
    )
    after.finish(round_run)

    assert after.runs_of_round(round_run) == [first, second]
    assert [m.value for m in client.get_metric_history(first, "decode_tok_s")] == [10.0, 11.0]
    assert client.get_run(first).data.tags["verdict"] == "keep"
    assert client.get_run(first).info.status == "FINISHED"
    assert len(client.search_experiments()) == 2  # Default and orchestrate, made once


def test_secrets_never_reach_mlflow(
    mlflow_db: MlflowStore,
    client: MlflowClient,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", ANTHROPIC_KEY)
    monkeypatch.setenv("HF_TOKEN", HF_TOKEN)
    monkeypatch.setenv("PGPASSWORD", DB_PASSWORD)
    sink = MlflowSink()
    round_run = sink.start_round(
        round_id=1,
        cluster="twin",
        params={"api_key": "abc123", "ledger": f"postgresql://me:{DB_PASSWORD}@db/x"},
        tags={"proxy": ANTHROPIC_KEY, "operator": "ana"},
    )
    run = sink.start_experiment(
        parent_run_id=round_run,
        number=1,
        kind="candidate",
        params={
            "max_num_batched_tokens": 8192,
            "tokenizer": "/models/qwen",
            "hf_token": "whatever",
            "extra_env": f"HF_TOKEN={HF_TOKEN}",
            "description": f"retry with key {ANTHROPIC_KEY}",
        },
    )
    launcher = (
        f"export HF_TOKEN={HF_TOKEN}\nexport VLLM_API_KEY='not from env 123'\n"
        "vllm serve m --api-key secret-from-flag-999 \\\n  --max-num-batched-tokens 8192\n"
    )
    sink.log_texts(
        run,
        {
            "launchers/node-0.sh": launcher,
            "request.json": '{"api_key": "in-json-000", "model": "m"}',
            "logs/node-0.log": f"Authorization: Bearer {ANTHROPIC_KEY} sent\n",
            "secrets.env": "anything at all\n",
        },
    )
    local = tmp_path / "boot.log"
    local.write_text(f"token in a file {HF_TOKEN}\n", encoding="utf-8")
    sink.log_files(run, {"logs": local})
    sink.set_tags(run, {"note": f"used {DB_PASSWORD}", "password": "x"})
    sink.finish(run)

    parent = client.get_run(round_run)
    assert parent.data.params == {"api_key": "***", "ledger": "postgresql://me:***@db/x"}
    assert parent.data.tags["proxy"] == "***"
    assert parent.data.tags["operator"] == "ana"
    child = client.get_run(run)
    assert child.data.params == {
        "max_num_batched_tokens": "8192",  # "tokens" is a knob, not a secret
        "tokenizer": "/models/qwen",
        "hf_token": "***",
        "extra_env": "HF_TOKEN=***",
        "description": "retry with key ***",
    }
    assert child.data.tags["note"] == "used ***"
    assert child.data.tags["password"] == "***"
    assert _text(client, run, "launchers/node-0.sh", tmp_path) == (
        "export HF_TOKEN=***\nexport VLLM_API_KEY='***'\n"
        "vllm serve m --api-key *** \\\n  --max-num-batched-tokens 8192\n"
    )
    assert _text(client, run, "request.json", tmp_path) == '{"api_key": "***", "model": "m"}'
    assert _text(client, run, "logs/node-0.log", tmp_path) == "Authorization: Bearer *** sent\n"
    assert _text(client, run, "secrets.env", tmp_path) == "***"
    assert _text(client, run, "logs/boot.log", tmp_path) == "token in a file ***\n"
    assert local.read_text(encoding="utf-8") == f"token in a file {HF_TOKEN}\n"  # untouched

    # Nowhere in the store: not in the database, not in any artifact.
    stored = [mlflow_db.db_path, *sorted(mlflow_db.artifact_root.rglob("*"))]
    for path in stored:
        if path.is_file():
            data = path.read_bytes()
            for secret in (ANTHROPIC_KEY, HF_TOKEN, DB_PASSWORD, "secret-from-flag-999"):
                assert secret.encode() not in data, f"{secret} found in {path}"


def test_our_own_key_params_are_shown_and_secret_names_stay_masked(
    mlflow_db: MlflowStore, client: MlflowClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``config_key`` (a config's hash, on every child run) showed as ``***``: the word "key"
    names a secret. orchestrate's own params and tags of that name are shown now; a name a
    user gives (an environment's, a launcher's, a param's) with KEY, TOKEN or PASSWORD in it
    is masked as before, and so is a config key equal to an environment secret."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", ANTHROPIC_KEY)
    sink = MlflowSink()
    round_run = sink.start_round(round_id=1, cluster="twin", params={"budget": "1"})
    run = sink.start_experiment(
        parent_run_id=round_run,
        number=1,
        kind="candidate",
        params={
            "config_key": "3f2a9c0d1e7b",
            "HF_API_KEY": "hf-api-value",
            "OPENAI_KEY": "openai-value",
            "SSH_KEY": "ssh-value",
            "GITHUB_TOKEN": "github-value",
            "PASSWORD": "password-value",
            "CONFIG_KEY": "user-config-value",
            "description": "CONFIG_KEY=user-config-value HF_API_KEY=hf-api-value",
        },
        tags={"champion_key": "9b8a7c6d5e4f", "config_key": ANTHROPIC_KEY},
    )
    child = client.get_run(run)
    assert child.data.params == {
        "config_key": "3f2a9c0d1e7b",
        "HF_API_KEY": "***",
        "OPENAI_KEY": "***",
        "SSH_KEY": "***",
        "GITHUB_TOKEN": "***",
        "PASSWORD": "***",
        "CONFIG_KEY": "***",
        "description": "CONFIG_KEY=*** HF_API_KEY=***",
    }
    assert child.data.tags["champion_key"] == "9b8a7c6d5e4f"
    assert child.data.tags["config_key"] == "***"  # an environment secret, whatever its name


def test_long_values_are_truncated_and_names_sanitised(
    mlflow_db: MlflowStore, client: MlflowClient
) -> None:
    sink = MlflowSink()
    round_run = sink.start_round(
        round_id=1, cluster="twin", params={"launcher": "x" * 10_000}, tags={"log": "y" * 9_000}
    )
    sink.log_metrics(round_run, {"ttft p50 (ms)@c=8": 1.0, "cells/../decode:tok/s": 2.0})
    run = client.get_run(round_run)
    launcher = run.data.params["launcher"]
    assert len(launcher) == validation.MAX_PARAM_VAL_LENGTH
    assert launcher.endswith("...[truncated]")
    assert launcher.startswith("x" * 5000)
    assert len(run.data.tags["log"]) == validation.MAX_TAG_VAL_LENGTH
    assert set(run.data.metrics) == {"ttft p50 _ms__c_8", "cells/decode_tok/s"}
    with pytest.raises(ValueError, match="both become"):
        sink.log_metrics(round_run, {"a:b": 1.0, "a@b": 2.0})


# Quadratic redaction patterns take hours on texts like these; linear ones, milliseconds.
@pytest.mark.timeout(30)
def test_redaction_is_linear_on_pathological_texts(
    mlflow_db: MlflowStore, client: MlflowClient, tmp_path: Path
) -> None:
    n = 200_000
    texts = {
        "letters.txt": "a" * n,
        "dashes.txt": "-" * n,
        "names.txt": "x.y-z_" * (n // 6),
        "pairs.txt": "a:" * (n // 2),
        "urls.txt": "a://b:" * (n // 6),
        "flags.txt": "--k \\\n" * (n // 6),
    }
    sink = MlflowSink()
    run = sink.start_round(round_id=1, cluster="twin", params={"long": "p" * n})
    sink.log_texts(run, texts)
    assert _text(client, run, "letters.txt", tmp_path) == texts["letters.txt"]


def test_limits_match_the_installed_mlflow() -> None:
    assert mlflow_values.MAX_PARAM_VALUE == validation.MAX_PARAM_VAL_LENGTH
    assert mlflow_values.MAX_TAG_VALUE == validation.MAX_TAG_VAL_LENGTH
    assert mlflow_values.MAX_KEY == validation.MAX_ENTITY_KEY_LENGTH
    assert mlflow_sink._MAX_PARAMS_TAGS_PER_BATCH == validation.MAX_PARAMS_TAGS_PER_BATCH
    assert mlflow_sink._MAX_METRICS_PER_BATCH == validation.MAX_METRICS_PER_BATCH


def test_defaults_to_mlflow_db_and_mlartifacts_in_the_working_directory(
    mlflow_db: MlflowStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    shutil.copyfile(mlflow_db.db_path, workdir / "mlflow.db")  # migrated already: faster
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    monkeypatch.chdir(workdir)
    sink = MlflowSink()
    monkeypatch.chdir(tmp_path)  # the sink keeps what it resolved
    assert sink.tracking_uri == f"sqlite:///{workdir / 'mlflow.db'}"
    run = sink.start_round(round_id=1, cluster="twin", params={})
    sink.log_texts(run, {"cells.json": "[]"})
    artifact = workdir / "mlartifacts" / run / "artifacts" / "cells.json"
    assert artifact.read_text(encoding="utf-8") == "[]"
    assert not (tmp_path / "mlflow.db").exists()


def test_a_many_params_experiment_is_logged_in_batches(
    mlflow_db: MlflowStore, client: MlflowClient
) -> None:
    sink = MlflowSink()
    round_run = sink.start_round(round_id=1, cluster="twin", params={})
    params = {f"knob_{i:03d}": i for i in range(250)}
    run = sink.start_experiment(parent_run_id=round_run, number=1, kind="sweep", params=params)
    sink.log_metrics(run, {f"cell_{i:04d}": float(i) for i in range(1500)})
    stored = client.get_run(run).data
    assert stored.params == {key: str(value) for key, value in params.items()}
    assert len(stored.metrics) == 1500


@pytest.mark.parametrize(
    "uri", ["file:///tmp/mlruns", "/tmp/mlruns", "mlruns", "./mlruns", "C:\\mlruns"]
)
def test_a_file_store_is_refused(uri: str) -> None:
    with pytest.raises(MlflowSinkError, match="file store") as caught:
        MlflowSink(tracking_uri=uri)
    assert caught.value.operation == "configure"
    assert caught.value.tracking_uri == uri
    assert caught.value.exit_code == 4
    assert isinstance(caught.value, OrchestrateError)


def test_a_file_store_in_the_environment_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "file:./mlruns")
    with pytest.raises(MlflowSinkError, match="file store"):
        MlflowSink()


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port  # closed again, nothing listens


# MLflow alone retries a refused database connection for about 100 s.
@pytest.mark.timeout(20)
def test_an_unreachable_database_fails_at_once_with_the_password_masked() -> None:
    uri = f"postgresql+psycopg://me:hunter22@127.0.0.1:{_closed_port()}/mlflow"
    with pytest.raises(MlflowSinkError) as caught:
        MlflowSink(tracking_uri=uri)
    error = caught.value
    assert error.operation == "open the tracking store"
    assert "hunter22" not in str(error)
    assert "hunter22" not in error.tracking_uri
    assert error.tracking_uri.startswith("postgresql+psycopg://me:***@127.0.0.1:")
    assert isinstance(error.__cause__, OperationalError)


def test_an_unreachable_tracking_server_is_translated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    uri = f"http://127.0.0.1:{_closed_port()}"
    with pytest.raises(MlflowSinkError, match="Connection refused") as caught:
        MlflowSink(tracking_uri=uri)
    assert caught.value.tracking_uri == uri
    assert isinstance(caught.value.__cause__, MlflowException)


def test_a_sqlite_store_that_cannot_be_created_is_translated(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("", encoding="utf-8")
    with pytest.raises(MlflowSinkError) as caught:
        MlflowSink(tracking_uri=f"sqlite:///{blocker}/mlflow.db")
    assert isinstance(caught.value.__cause__, OSError)


def test_an_unknown_run_is_translated(mlflow_db: MlflowStore) -> None:
    sink = MlflowSink()
    missing = "0" * 32
    calls: list[tuple[Callable[[], object], str]] = [
        (lambda: sink.log_metrics(missing, {"x": 1.0}), "log metrics"),
        (lambda: sink.finish(missing), "finish run"),
        (lambda: sink.runs_of_round(missing), "list runs of round"),
        (
            lambda: sink.start_experiment(
                parent_run_id=missing, number=1, kind="candidate", params={}
            ),
            "start experiment",
        ),
    ]
    for call, operation in calls:
        with pytest.raises(MlflowSinkError) as caught:
            call()
        assert caught.value.operation == operation
        assert isinstance(caught.value.__cause__, MlflowException)


def test_a_deleted_experiment_is_an_error(mlflow_db: MlflowStore, client: MlflowClient) -> None:
    sink = MlflowSink(experiment_name="gone")
    client.delete_experiment(sink.experiment_id)
    with pytest.raises(MlflowSinkError, match="is deleted"):
        MlflowSink(experiment_name="gone")


def test_bad_arguments_are_value_errors(mlflow_db: MlflowStore) -> None:
    sink = MlflowSink()
    run = sink.start_round(round_id=1, cluster="twin", params={})
    with pytest.raises(ValueError, match="status"):
        sink.finish(run, "DONE")
    for path in ["../escape.txt", "/etc/passwd", "", "a\\b"]:
        with pytest.raises(ValueError, match="artifact path"):
            sink.log_texts(run, {path: "x"})
    for directory in ["../up", "/abs"]:
        with pytest.raises(ValueError, match="artifact path"):
            sink.log_files(run, {directory: Path(__file__)})


def test_importing_the_sink_does_not_import_mlflow() -> None:
    code = "import sys, ledger.mlflow_sink; assert 'mlflow' not in sys.modules"
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=root,
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    assert done.returncode == 0, done.stderr


def test_what_a_resume_reads_back(mlflow_db: MlflowStore, client: MlflowClient) -> None:
    # a run created just before a kill is found by its tags; its state says what it lacks
    sink = MlflowSink()
    round_run = sink.start_round(
        round_id=3, cluster="twin", params={}, tags={"orchestrate.round_started": "twin/3/t0"}
    )
    child = sink.start_experiment(parent_run_id=round_run, number=9, kind="candidate", params={})
    assert sink.find_run({"orchestrate.round_started": "twin/3/t0"}) == round_run
    assert sink.find_run({"orchestrate.round_started": "twin/3/t1"}) is None
    assert sink.find_run({"mlflow.parentRunId": round_run, "orchestrate.experiment": "9"}) == child
    with pytest.raises(ValueError, match="quote"):
        sink.find_run({"status": "it's"})
    state = sink.run_state(child)
    assert state is not None and state.status == "RUNNING" and state.metrics == frozenset()
    sink.log_metrics(child, {"objective": 1.0})
    sink.log_metrics(child, {"remeasure.objective": 2.0}, step=4)
    sink.set_tags(child, {"status": "keep"})
    sink.finish(child)
    state = sink.run_state(child)
    assert state is not None and state.status == "FINISHED"
    assert state.tags["status"] == "keep"
    assert state.metrics == {"objective", "remeasure.objective"}
    assert sink.metric_steps(child, "remeasure.objective") == {4}
    assert sink.run_state("0" * 32) is None
    client.delete_run(child)
    assert sink.run_state(child) is None


#: A first command killed while MLflow migrates its new store: its initial tables made, the
#: migrations after them never run (the process dies where they start).
_KILLED_MIDWAY = """
import os, signal, sys
import mlflow.store.db.utils as utils

def die(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)

utils._upgrade_db = die
from ledger.mlflow_sink import MlflowSink
MlflowSink(sys.argv[1], experiment_name="orchestrate/twin")
"""


def test_a_store_whose_creation_was_killed_midway_opens_on_the_next_command(
    tmp_path: Path,
) -> None:
    """Ctrl-C a second into the first command of a folder used to leave ``mlflow.db``
    half-migrated, and no later command could open it ("table … already exists"), whatever
    the resume line promised. The store is now made beside its name and takes it only once
    MLflow's migrations are done: the next command creates it whole, and the killed one's
    leftover goes."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    killed = subprocess.run(
        [sys.executable, "-c", _KILLED_MIDWAY, uri], capture_output=True, text=True, timeout=120
    )
    assert killed.returncode == -9, killed.stderr
    assert not (tmp_path / "mlflow.db").exists()
    assert list(tmp_path.glob(".mlflow.db.creating-*")), "the creation never started"
    sink = MlflowSink(uri, experiment_name="orchestrate/twin")
    assert sink.experiment_id
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mlflow.db"]
    again = MlflowSink(uri, experiment_name="orchestrate/twin")
    assert again.experiment_id == sink.experiment_id


_FIRST_STORE = """
import logging, sys
from ledger.mlflow_sink import MlflowSink
MlflowSink(sys.argv[1], experiment_name="orchestrate/twin")
logging.getLogger("mlflow.store.db.utils").warning("a warning of the store's")
logging.getLogger("alembic.runtime.migration").error("an error of a migration's")
"""


def test_creating_the_store_prints_no_info_lines_but_warnings_still_show(tmp_path: Path) -> None:
    """The first round of a folder printed MLflow's ``INFO mlflow.store.db.utils: Creating
    initial MLflow database tables...`` among its own lines. The store's INFO lines are quiet
    now; a warning or an error of the same loggers still reaches the terminal."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    made = subprocess.run(
        [sys.executable, "-c", _FIRST_STORE, uri], capture_output=True, text=True, timeout=120
    )
    assert made.returncode == 0, made.stderr
    assert (tmp_path / "mlflow.db").exists()
    said = made.stdout + made.stderr
    assert " INFO " not in said, said
    assert "Creating initial MLflow database tables" not in said, said
    assert "a warning of the store's" in said and "an error of a migration's" in said, said


def test_mlflows_database_layer_logs_no_error_it_raises_for_the_sink_to_say(
    mlflow_db: MlflowStore,
) -> None:
    """MLflow's database layer logs each database error (its SQL, its traceback) and then
    raises it; the sink says the error it raises in one line. A store locked for a minute put
    four tracebacks into a night's log beside that line, each read as a crash. Once a store is
    open, that logger says nothing an error would, and the store's own warnings still show."""
    open_store(mlflow_db.tracking_uri)
    layer = logging.getLogger("mlflow.store.db.utils")
    said = [
        bool(layer.filter(layer.makeRecord(layer.name, level, __file__, 0, "x", (), None)))
        for level in (logging.ERROR, logging.WARNING)
    ]
    assert said == [False, True]
    assert logging.getLogger("mlflow.store.db_migrations").isEnabledFor(logging.WARNING)
