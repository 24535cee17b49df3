"""What a resume says of the budget it keeps: only what the command asked for. A bare
``orchestrate round`` (a timer's, or the line ``status`` prints) asked for no budget; it said
"round 2 keeps its budget 1 (this command asked for 6)", 6 being the profile's (review)."""

from __future__ import annotations

import os
from pathlib import Path

from tests.fixtures.cli import orchestrate
from tests.fixtures.profiles import twin_profile_data, write_profile


def test_a_bare_resume_asked_for_no_budget_and_one_given_is_said(tmp_path: Path) -> None:
    data = twin_profile_data(nodes=2)
    argv = data["launcher"]["argv"]
    argv[argv.index("--tensor-parallel-size") + 1] = "2"
    data["budget"] = 6
    data["cells"] = data["cells"][:1]
    write_profile(tmp_path, data)
    env = {**os.environ, "ORCHESTRATE_LEDGER": f"sqlite:///{tmp_path}/o.db"}
    try:
        # the GPU-hours cap stops the round after its baseline: it stays open, to resume
        first = orchestrate(
            tmp_path, "round", "--budget", "2", "--max-gpu-hours", "0.000001", "-p",
            "profile.yaml", env=env,
        )  # fmt: skip
        assert "--max-gpu-hours" in first.stdout + first.stderr, first.stderr
        bare = orchestrate(tmp_path, "round", "-p", "profile.yaml", env=env)
        said = bare.stdout + bare.stderr
        assert "keeps its --max-gpu-hours" in said, said  # it resumed round 1
        assert "keeps its budget" not in said, said
        given = orchestrate(tmp_path, "round", "--budget", "3", "-p", "profile.yaml", env=env)
        said = " ".join((given.stdout + given.stderr).split())
        assert "round 1 keeps its budget 2 (this command asked for 3)" in said, said
    finally:
        orchestrate(tmp_path, "cluster", "down", "-p", "profile.yaml", env=env)
