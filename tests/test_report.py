"""``orchestrate report``: a round's HTML page and PNGs, from a ledger written by a released
orchestrate (``fixtures/ledgers/schema2.sqlite``: a keep, an invalid, a crash, a champion
re-measure), opened in headless Chromium (Debian's package) to check that the page's pictures
are drawn; and the one-line refusals. That a round writes its report at its end and logs it
to MLflow is checked in ``test_round_twin.py``."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib import image
from mlflow.tracking import MlflowClient

from knobs.vocabulary import ProposalStatus
from ledger import Ledger, LedgerError
from orchestrator.stops import last_stop
from tests.fixtures.cli import ORCHESTRATE, orchestrate
from tests.fixtures.profiles import twin_profile_data, write_profile
from tests.fixtures.wait import wait_until

LEDGERS = Path(__file__).parent / "fixtures" / "ledgers"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _chromium(*args: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None, "no chromium: apt-get install chromium (.ci/run does)"
    return subprocess.run(
        [
            CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
            "--virtual-time-budget=15000", *args,
        ],
        capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip


def _fixture(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    shutil.copyfile(LEDGERS / "schema2.sqlite", tmp_path / "orchestrate.db")
    data = twin_profile_data()
    data["cluster"]["name"] = "twin-local"  # the cluster the release recorded
    profile = write_profile(tmp_path, data)
    return profile, {**os.environ, "ORCHESTRATE_LEDGER": f"sqlite:///{tmp_path}/orchestrate.db"}


def test_the_report_of_an_old_round_is_drawn_in_chromium(tmp_path: Path) -> None:
    profile, env = _fixture(tmp_path)
    done = orchestrate(
        tmp_path, "report", "--out", "out", "--profile", str(profile), env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "wrote out/report.html (round 1)"
    page = tmp_path / "out" / "report.html"
    html = page.read_text()
    for name in ("progress.png", "effects.png", "boots.png"):
        picture = image.imread(tmp_path / "out" / name)
        assert picture.shape[0] > 200 and picture.shape[1] > 400, name
        assert float(np.std(picture[..., :3])) > 0.05, f"{name} is blank"
    # what the ledger says, in words: the verdicts, the crash's class, the boots by use
    for words in ("invalid", "crash", "kv_capacity", "champion re-measure", "GPU-hours"):
        assert words in html, words
    # the crash failed for its config's reasons; the release recorded no stop short
    assert "failed: the config&#x27;s" in html
    assert "No boot was the infrastructure's" in html
    assert "Nothing stopped the round short." in html

    dom = _chromium("--dump-dom", page.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    body = re.search(r"<body[^>]*>", dom.stdout)
    assert body is not None, dom.stdout[:2000]
    assert 'data-images="3"' in body.group(0) and 'data-images-decoded="3"' in body.group(0)

    shot = tmp_path / "shot.png"
    taken = _chromium(f"--screenshot={shot}", "--window-size=1200,1600", page.as_uri())
    assert taken.returncode == 0 and shot.exists(), taken.stderr[-2000:]
    pixels = image.imread(shot)[..., :3]
    # the page's top 1600 pixels hold the title and the progress plot: not a blank page
    assert float(np.mean(pixels < 0.5)) > 0.01


def test_no_round_and_an_unknown_round_are_one_line_exit_3(tmp_path: Path) -> None:
    """A round the ledger does not have is a bad value (exit 3), as any ID a command names
    that the ledger lacks; the ledger answered (4 is one that failed)."""
    profile, env = _fixture(tmp_path)
    unknown = orchestrate(tmp_path, "report", "--round", "9", "--profile", str(profile), env=env)
    assert unknown.returncode == 3, unknown.stderr
    assert unknown.stderr.strip().splitlines()[-1] == (
        "Error: cluster twin-local has no round 9 (it has 1)"
    )
    empty = {**env, "ORCHESTRATE_LEDGER": f"sqlite:///{tmp_path}/empty.db"}
    Ledger(empty["ORCHESTRATE_LEDGER"]).close()  # a ledger with no round (none: exit 4)
    none = orchestrate(tmp_path, "report", "--profile", str(profile), env=empty)
    assert none.returncode == 3, none.stderr
    lines = none.stderr.strip().splitlines()
    assert lines == [
        "Error: the ledger has no round of cluster twin-local: run `orchestrate round` first"
    ]
    assert not (tmp_path / "reports").exists()


def test_without_matplotlib_the_report_is_one_line_and_writes_nothing(tmp_path: Path) -> None:
    """matplotlib is imported only for the report's plots; where it does not import (a
    trimmed install: the sixth GPU run carried none), ``orchestrate report`` says so in one
    line, exit 2, and writes nothing (a round's end notes the same line and still exits 0: it
    catches every ``OrchestrateError`` of its report). The package is hidden by a folder ahead
    of site-packages whose ``matplotlib`` raises ImportError, as an absent one does."""
    profile, env = _fixture(tmp_path)
    hidden = tmp_path / "hidden" / "matplotlib"
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text("raise ImportError('No module named matplotlib')\n")
    env = {
        **env,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(hidden.parent), env.get("PYTHONPATH")])),
    }
    done = orchestrate(tmp_path, "report", "--out", "out", "--profile", str(profile), env=env)
    assert done.returncode == 2, done.stderr
    # the released ledger is upgraded first (its own lines); then the one error line
    error = [line for line in done.stderr.splitlines() if line.startswith("Error:")]
    assert error == [
        "Error: the report's plots need matplotlib, which does not import here (No module "
        "named matplotlib); install it (pip install 'matplotlib>=3.8,<4') and run "
        "`orchestrate report`"
    ], done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists()


def test_a_round_that_stops_short_writes_its_report_and_results_as_far_as_it_got(
    tmp_path: Path,
) -> None:
    """A round stopped by its cap writes its report, as before; one that stops with exit 5 (the
    head's port taken: its boots fail for the infrastructure's reasons) wrote none until
    ``orchestrate report`` was run. It writes it now, and results.tsv on its MLflow parent
    run, as far as it got, the stop among them; the stop's line is still the command's last
    word and its exit code the command's."""
    data, profile, env = _one_cell_twin(tmp_path)
    page = tmp_path / "reports" / "round-1" / "report.html"
    # the baseline, then the cap (0.36 s) before the first candidate: the round stays open
    capped = orchestrate(
        tmp_path, "round", "--budget", "2", "--max-hours", "0.0001", "--profile", profile,
        env=env, timeout=300,
    )  # fmt: skip
    assert capped.returncode == 0, capped.stderr
    assert "stopped by --max-hours" in " ".join(capped.stdout.split())
    assert page.exists(), capped.stdout
    shutil.rmtree(tmp_path / "reports")

    stopped = _round_with_the_heads_port_taken(tmp_path, data, profile, env)
    assert stopped.returncode == 5, stopped.stderr
    said = stopped.stderr.strip().splitlines()
    errors = [line for line in said if line.startswith("Error:")]
    assert len(errors) == 1 and said[-1] == errors[0], said
    assert "node 0" in errors[0] and "nothing was barred" in errors[0], errors
    assert "Traceback" not in stopped.stderr
    assert "the round's report, as far as it got: reports/round-1/report.html" in " ".join(
        stopped.stdout.split()
    )
    html = page.read_text()
    assert "(exit 5)" in html and "Nothing stopped the round short." not in html
    assert "baseline" in html
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    with Ledger(env["ORCHESTRATE_LEDGER"]) as ledger:
        (rnd,) = ledger.rounds("twin-local")
        assert rnd.status == "running" and rnd.mlflow_run_id
        decided = [e for e in ledger.experiments() if e.status]
    results = client.download_artifacts(rnd.mlflow_run_id, "results.tsv", str(tmp_path / "a"))
    rows = Path(results).read_text().splitlines()
    assert len(rows) == 1 + len(decided) and rows[1].split("\t")[4] == "keep", rows
    logged = {a.path for a in client.list_artifacts(rnd.mlflow_run_id, "report")}
    assert "report/report.html" in logged, logged


def test_a_round_whose_report_cannot_be_written_says_so_in_one_line_and_keeps_its_exit(
    tmp_path: Path,
) -> None:
    """A round whose report could not be written (its folder under a file here; a full or
    read-only disk alike) said only why, with no word of how it is written later. One line
    now names the round, the folder, why, and the command that writes it once it can be
    (nothing lost): at the round's end (exit 0) and where it stops short (exit 5, its stop
    recorded and its line still the command's last)."""
    data, profile, env = _one_cell_twin(tmp_path)
    (tmp_path / "reports").write_text("a file where the reports' folder goes\n")
    folder = tmp_path / "reports" / "round-1"

    def said_of_the_report(out: str) -> str:
        lines = [line for line in out.splitlines() if "round 1's report" in line]
        assert len(lines) == 1, out
        (line,) = lines
        assert line.startswith(f"round 1's report was not written into {folder} ("), line
        assert "it is under reports, a file" in line, line
        assert "nothing of the round is lost" in line, line
        assert "`orchestrate report --round 1` writes it" in line, line
        return line

    # the baseline, then the cap before the first candidate: the round's end, exit 0
    capped = orchestrate(
        tmp_path, "round", "--budget", "2", "--max-hours", "0.0001", "--profile", profile,
        env=env, timeout=300,
    )  # fmt: skip
    assert capped.returncode == 0, capped.stderr
    assert "Traceback" not in capped.stderr
    said_of_the_report(capped.stdout)
    # the head's port taken: stopped short, exit 5
    stopped = _round_with_the_heads_port_taken(tmp_path, data, profile, env)
    assert stopped.returncode == 5, stopped.stderr
    said = stopped.stderr.strip().splitlines()
    errors = [line for line in said if line.startswith("Error:")]
    assert len(errors) == 1 and said[-1] == errors[0], said
    assert "Traceback" not in stopped.stderr
    said_of_the_report(stopped.stdout)
    assert "as far as it got" not in stopped.stdout
    with Ledger(env["ORCHESTRATE_LEDGER"]) as ledger:
        assert last_stop(ledger, "twin-local", 1) is not None
    # the folder made writable: the command the line names writes it, the stop in it
    (tmp_path / "reports").unlink()
    report = orchestrate(tmp_path, "report", "--round", "1", "--profile", profile, env=env)
    assert report.returncode == 0, report.stderr
    assert "(exit 5)" in (folder / "report.html").read_text()


def test_an_interrupted_round_writes_its_report_and_still_exits_130(tmp_path: Path) -> None:
    """A round interrupted (SIGTERM, as a service manager stops it) while it waits for a
    person's approval: its report is written as far as it got (the baseline), and the command
    still ends on the interrupt's line with exit 130."""
    data = twin_profile_data()
    data["cells"] = data["cells"][:1]
    data["verdict"] = {"policy": "threshold", "threshold_pct": 2.0}
    profile = str(write_profile(tmp_path, data))
    ledger_url = f"sqlite:///{tmp_path}/orchestrate.db"
    env = {**os.environ, "ORCHESTRATE_LEDGER": ledger_url}
    code, out, err = _interrupted_when(
        tmp_path,
        ["round", "--budget", "1", "--approve", "queue", "--profile", profile],
        env,
        "the round waiting for an approval",
        lambda ledger: bool(ledger.proposals(status=ProposalStatus.PENDING)),
    )
    said = err.strip().splitlines()
    assert code == 130, said
    assert said[-1] == "Error: interrupted; run the same command again to resume", said
    assert "the round's report, as far as it got: reports/round-1/report.html" in " ".join(
        out.split()
    )
    html = (tmp_path / "reports" / "round-1" / "report.html").read_text()
    # the command's words with it: what it said of the stop's record, should the page lack it
    assert "(exit 130)" in html and "baseline" in html, (err, out)
    # `status` after: the round is no longer running (a resume goes on), and the proposal it
    # waited on still waits for a person, said with the commands that decide it
    status = orchestrate(tmp_path, "status", "--profile", profile, env=env)
    assert status.returncode == 0, status.stderr
    shown = " ".join(status.stdout.split())
    assert f"(run `orchestrate round --profile {profile}` to resume)" in shown, shown
    assert "round 1 running" not in shown
    assert "proposal 1 of round 1 waits for a person: " in shown, shown
    assert f"`orchestrate proposals approve 1 --profile {profile}`" in shown, shown


def test_a_round_interrupted_mid_boot_is_said_stopped_not_killed_and_resumed(
    tmp_path: Path,
) -> None:
    """Interrupted (SIGTERM, as Ctrl-C) while the baseline's boot is up: the boot is torn down
    and closed as interrupted, and the stop recorded. The report written as the command ends
    said the round was also "killed with no stop recorded" and "resumed" (a resume inferred
    from the boot the interrupt closed, as an older release's resume would have closed it)."""
    data = twin_profile_data()
    # one cell, measured for 20 s: the baseline's boot is up while it is interrupted
    data["cells"] = [{**data["cells"][0], "duration_s": 20.0}]
    profile = str(write_profile(tmp_path, data))
    ledger_url = f"sqlite:///{tmp_path}/orchestrate.db"
    env = {**os.environ, "ORCHESTRATE_LEDGER": ledger_url}
    try:
        # SIGTERM, which the command takes as it takes Ctrl-C: a SIGINT is ignored by a child
        # of a pytest-xdist worker, which ignores it itself
        code, out, err = _interrupted_when(
            tmp_path,
            ["round", "--budget", "1", "--profile", profile],
            env,
            "the baseline's boot up",
            lambda ledger: any(
                b.healthy_at is not None and b.experiment_id == 1
                for b in ledger.open_boots("twin-local")
            ),
        )
    finally:
        orchestrate(tmp_path, "cluster", "down", "--profile", profile, env=env)
    assert code == 130, (out[-2000:], err[-2000:])
    with Ledger(ledger_url, read_only=True) as ledger:
        assert [b.failure_detail for b in ledger.boots(1)] == ["interrupted; torn down"]
    html = " ".join((tmp_path / "reports" / "round-1" / "report.html").read_text().split())
    assert (
        "The round was stopped short 1 time(s) with a stop recorded and killed 0 time(s) "
        "without one; it was resumed 0 time(s)."
    ) in html, html[-3000:]
    assert "resumed by" not in html
    # the baseline's boot, cut short before its verdict, is the baseline's (was "candidate")
    assert "1 boot (1 baseline, 0 candidate," in html, html[-3000:]


def test_a_report_into_a_file_is_refused_before_the_ledger_is_read_or_a_plot_drawn(
    tmp_path: Path,
) -> None:
    """``--out`` naming a file (or a path under one) drew every plot, and on a folder with no
    ledger yet created one, before it said the folder could not be written. It says so first
    now: nothing is created, no plot drawn (matplotlib, hidden here, is never imported)."""
    profile, env = _fixture(tmp_path)
    (tmp_path / "taken.html").write_text("a page of its own\n")
    hidden = tmp_path / "hidden" / "matplotlib"
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text("raise ImportError('No module named matplotlib')\n")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(hidden.parent), env.get("PYTHONPATH")]))
    fresh = {**env, "ORCHESTRATE_LEDGER": f"sqlite:///{tmp_path}/fresh.db"}
    for out, ledger_env, says in [
        ("taken.html", env, "it is a file"),
        ("taken.html/round", fresh, "it is under taken.html, a file"),
    ]:
        done = orchestrate(
            tmp_path, "report", "--out", out, "--profile", str(profile), env=ledger_env
        )
        assert done.returncode == 2, done.stderr
        # the one line, and nothing before it: the ledger was not even opened (upgraded)
        assert done.stderr.strip().splitlines() == [
            f"Error: cannot write the report into {out}: {says}; name a folder"
        ], done.stderr
    assert (tmp_path / "taken.html").read_text() == "a page of its own\n"
    assert not (tmp_path / "fresh.db").exists()


def test_the_report_of_a_round_killed_and_resumed_says_so(tmp_path: Path) -> None:
    """A round SIGKILLed as its change's boot starts (``boot.started@2``: the baseline was
    boot 1), then resumed by the same command. A kill records no stop, and the report said
    "Nothing stopped the round short." of a round that was killed and resumed. Now it says
    the round was killed and when it was resumed, and what the boot the kill left open came
    to (it never came up: it counts for nothing). A ledger whose resume was not recorded (a
    release from before) shows it as inferred from the boot the resume closed."""
    from tests.test_kill_points import Site, _profile_data

    site = Site(tmp_path)
    write_profile(site.root, _profile_data(champion_boots=1))
    try:
        killed = site.round({"ORCHESTRATE_CRASHPOINT": "boot.started@2"})
        assert killed.returncode == -9, killed.stderr
        resumed = site.round()
        assert resumed.returncode == 0, resumed.stderr
    finally:
        orchestrate(tmp_path, "cluster", "down", "--profile", "profile.yaml", env=site.env)
    html = " ".join((tmp_path / "reports" / "round-1" / "report.html").read_text().split())
    assert "Nothing stopped the round short." not in html
    assert (
        "The round was stopped short 0 time(s) with a stop recorded and killed 1 time(s) "
        "without one; it was resumed 1 time(s)."
    ) in html, html[-3000:]
    assert (
        "killed with no stop recorded (kill -9, a crash, the host lost, or suspended past its "
        "lease); resumed at "
    ) in html
    assert (
        "boot #2 of experiment #2 was coming up: it measured nothing and counts for nothing"
    ) in html, html[-3000:]
    # a ledger of a release from before resumes and profiles were recorded
    with sqlite3.connect(tmp_path / "orchestrate.db") as db:
        db.execute("DELETE FROM event WHERE kind IN ('round-resumed', 'profile-revised')")
    done = orchestrate(
        tmp_path, "report", "--out", "old", "--profile", "profile.yaml", env=site.env
    )
    assert done.returncode == 0, done.stderr
    html = " ".join((tmp_path / "old" / "report.html").read_text().split())
    assert "killed with no stop recorded; resumed by " in html, html[-3000:]
    assert "resumes are recorded; that one was not)" in html
    assert "boot #2 of experiment #2 was coming up" in html


def test_objectives_over_ten_thousand_are_shown_as_the_cli_shows_them(tmp_path: Path) -> None:
    """The report showed the released round's objectives (10128.0, 13124.5 tok/s) as
    ``1.013e+04`` and ``1.312e+04`` beside ``9526``; it shows them as every line of the CLI
    does now, one decimal and no exponent."""
    profile, env = _fixture(tmp_path)
    done = orchestrate(tmp_path, "report", "--out", "out", "--profile", str(profile), env=env)
    assert done.returncode == 0, done.stderr
    html = (tmp_path / "out" / "report.html").read_text()
    cells = re.findall(r'<td class="n">([^<]*)</td>', html)
    assert "10128.0" in cells and "13124.5" in cells, cells
    text = re.sub(r"<img [^>]*>", "", html)  # the pictures' base64 aside
    assert not re.search(r"\de[+-]\d", text), "a number in scientific notation"


def test_the_report_of_a_round_with_nothing_decided_prints_no_warning(tmp_path: Path) -> None:
    """A round stopped before its first verdict (here: created, nothing run): its report is
    drawn without matplotlib's ``No artists with labels found to put in legend`` warning on
    the terminal (the progress plot has no legend then)."""
    profile = write_profile(tmp_path, twin_profile_data())
    env = {**os.environ, "ORCHESTRATE_LEDGER": f"sqlite:///{tmp_path}/orchestrate.db"}
    with Ledger(env["ORCHESTRATE_LEDGER"]) as ledger:
        ledger.create_round(
            cluster=twin_profile_data()["cluster"]["name"],
            profile_name="twin",
            profile_digest="",
            budget=2,
            proposer="sweep",
            approve="auto",
            seed=0,
        )
    done = orchestrate(tmp_path, "report", "--out", "out", "--profile", str(profile), env=env)
    assert done.returncode == 0, done.stderr
    assert "Warning" not in done.stderr and "legend" not in done.stderr, done.stderr
    assert (tmp_path / "out" / "progress.png").exists()


def _interrupted_when(
    cwd: Path, args: list[str], env: dict[str, str], what: str, ready: Callable[[Ledger], bool]
) -> tuple[int, str, str]:
    """``orchestrate *args`` interrupted (SIGTERM, as a service manager or Ctrl-C stops it)
    once ``ready`` holds of its ledger (``what``): its exit status, stdout and stderr."""
    url = env["ORCHESTRATE_LEDGER"]
    proc = subprocess.Popen(
        [*ORCHESTRATE, *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )

    def seen() -> bool:
        assert proc.poll() is None, f"the command ended before {what}"
        try:
            with Ledger(url, read_only=True) as ledger:
                return ready(ledger)
        except LedgerError:  # not created yet, or being created
            return False

    try:
        wait_until(what, seen, timeout=240, interval=0.2)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, out, err


def _one_cell_twin(tmp_path: Path) -> tuple[dict[str, Any], str, dict[str, str]]:
    """A twin profile of one cell whose boots are not tried again for the infrastructure, and
    the environment of its ledger and MLflow store in ``tmp_path``."""
    data = twin_profile_data()
    data["cells"] = data["cells"][:1]
    data["verdict"] = {"policy": "threshold", "threshold_pct": 2.0, "infra_retries": 0}
    profile = str(write_profile(tmp_path, data))
    env = {
        **os.environ,
        "ORCHESTRATE_LEDGER": f"sqlite:///{tmp_path}/orchestrate.db",
        "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db",
    }
    return data, profile, env


def _round_with_the_heads_port_taken(
    tmp_path: Path, data: dict[str, Any], profile: str, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """``orchestrate round`` while another process listens on the head's port: its boots
    fail for the infrastructure's reason, and it stops short with exit 5."""
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", data["cluster"]["port"]))
        squatter.listen()
        return orchestrate(
            tmp_path, "round", "--budget", "2", "--max-hours", "10", "--profile", profile,
            env=env, timeout=300,
        )  # fmt: skip
