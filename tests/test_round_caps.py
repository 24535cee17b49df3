"""A round stopped by its cap (``--max-hours``, ``--max-gpu-hours``) records the stop as any
stop short is recorded (``round-stopped``): ``status``, ``status --json``, the report and the
MLflow parent run say the cap stopped it and how to go on, and the command exits 0 (README)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from ledger import Ledger
from tests.fixtures.cli import orchestrate
from tests.fixtures.profiles import twin_profile_data, write_profile


@pytest.mark.parametrize(
    ("flag", "said"),
    [
        ("--max-hours", "stopped by --max-hours 0.0001: 0 of 3 experiments done"),
        ("--max-gpu-hours", "stopped by --max-gpu-hours 1e-06 ("),
    ],
)
def test_a_capped_round_says_its_cap_everywhere(tmp_path: Path, flag: str, said: str) -> None:
    data = twin_profile_data()
    data["cells"] = data["cells"][:1]
    data["verdict"] = {"policy": "threshold", "threshold_pct": 2.0}
    profile = str(write_profile(tmp_path, data))
    env = {
        **os.environ,
        "ORCHESTRATE_LEDGER": f"sqlite:///{tmp_path}/orchestrate.db",
        "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db",
    }
    cap = "0.0001" if flag == "--max-hours" else "0.000001"
    # the baseline, then the cap before the first candidate: the round stays open
    done = orchestrate(
        tmp_path, "round", "--budget", "3", flag, cap, "--profile", profile, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert said in " ".join(done.stdout.split())

    status = orchestrate(tmp_path, "status", "--profile", profile, env=env)
    text = " ".join(status.stdout.split())
    assert "(exit 0): round 1 " + said in text, text
    assert "resumes it" in text

    seen = json.loads(
        orchestrate(tmp_path, "status", "--json", "--profile", profile, env=env).stdout
    )
    stopped = seen["running_round"]["stopped"]
    assert stopped is not None and stopped["exit_code"] == 0, seen
    assert said in stopped["reason"]

    html = (tmp_path / "reports" / "round-1" / "report.html").read_text()
    assert "Nothing stopped the round short." not in html
    assert said in " ".join(html.split())
    assert "running, 0 of 3" not in html and "(open: the same command resumes it" in html

    with Ledger(env["ORCHESTRATE_LEDGER"]) as ledger:
        (rnd,) = ledger.rounds("twin-local")
    assert rnd.status == "running" and rnd.mlflow_run_id
    metrics = MlflowClient(env["MLFLOW_TRACKING_URI"]).get_run(rnd.mlflow_run_id).data.metrics
    assert metrics["stops"] == 1.0, metrics
