"""A command whose output's reader went away (``orchestrate status | head -1``; the ``tee`` of
``orchestrate round | tee night.log`` killed) goes on as after a SIGHUP, its output to
/dev/null (``interrupts.outliving_readers``). Before, the first line written after the reader
left ended it with exit code 1 and nothing said: ``status | head -1`` failed a script under
``pipefail``, and a round ended mid-boot with its boot left "interrupted or killed"."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from ledger import Ledger
from tests.fixtures.cli import ORCHESTRATE, orchestrate
from tests.fixtures.profiles import twin_profile_data, write_profile


def _without_a_reader(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``orchestrate *args`` with its stdout a pipe whose reader is gone before the first
    line: every line it writes there meets a broken pipe. Its stderr is kept."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run(
            [*ORCHESTRATE, *args],
            cwd=cwd,
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=600,
            check=False,
        )
    finally:
        os.close(write)


def test_a_round_and_status_whose_reader_is_gone_go_on_to_their_end(tmp_path: Path) -> None:
    data = twin_profile_data(nodes=2)
    argv = data["launcher"]["argv"]
    argv[argv.index("--tensor-parallel-size") + 1] = "2"
    data["cells"] = [c for c in data["cells"] if c["name"] == "code-c1"]
    for cell in data["cells"]:
        cell["warmup_s"] = 0.1
        cell["duration_s"] = 0.5
    write_profile(tmp_path, data)
    try:
        done = _without_a_reader(tmp_path, "round", "--budget", "1", "-p", "profile.yaml")
        assert done.returncode == 0, done.stderr
        assert "Traceback" not in done.stderr, done.stderr
        with Ledger(f"sqlite:///{tmp_path / 'orchestrate.db'}") as ledger:
            decided = [e for e in ledger.experiments() if e.decided_at is not None]
            assert len(decided) == 2, decided  # the baseline and the round's one change
            assert ledger.open_boots() == []
        status = _without_a_reader(tmp_path, "status", "-p", "profile.yaml")
        assert (status.returncode, status.stderr) == (0, "")
    finally:
        orchestrate(tmp_path, "cluster", "down", "-p", "profile.yaml")
