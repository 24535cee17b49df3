"""``orchestrate cluster up --dry-run`` renders what ``cluster up`` would deploy — the ledger's
champion, fitted to the profile — and touches nothing: a missing ledger is not created, and a
ledger of an older release is read through an upgraded copy elsewhere, the file neither upgraded
nor copied aside (a PostgreSQL one upgraded inside a transaction that is rolled back)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from knobs.vocabulary import Kind, Status
from ledger import Ledger, LedgerNotReady, VerdictRecord
from orchestrator.cli import run
from orchestrator.profile import load_profile
from tests.fixtures.cli import orchestrate
from tests.fixtures.profiles import twin_profile_data, write_profile
from tests.fixtures.rounds import a_round
from tests.test_migrations import _copy_fixture_rows, _create_schema1, _version_rows

LEDGERS = Path(__file__).parent / "fixtures" / "ledgers"


def _config_line(stdout: str) -> str:
    return [line for line in stdout.splitlines() if line.startswith("# config ")][-1]


def test_a_dry_run_renders_the_ledgers_champion_and_creates_no_ledger(tmp_path: Path) -> None:
    """No ledger yet: the profile's starting config, and no ledger file afterwards. A ledger
    whose champion moved K from the starting 7 to 4: that champion, K 4 in the head's
    command, named by its experiment; with ``--set`` the change on top of it."""
    data = twin_profile_data()
    path = write_profile(tmp_path, data)
    profile = load_profile(str(path))
    db = tmp_path / "orchestrate.db"
    env = {**os.environ, "ORCHESTRATE_LEDGER": f"sqlite:///{db}"}

    first = orchestrate(tmp_path, "cluster", "up", "--dry-run", "--profile", str(path), env=env)
    assert first.returncode == 0, first.stderr
    start = profile.initial_champion()
    assert start.as_dict()["num_speculative_tokens"] != 4
    line = _config_line(first.stdout)
    assert f"# config {start.key} (the profile's starting config: no ledger yet at" in line
    assert not db.exists()

    champion = start.apply(profile.space.change(start, "num_speculative_tokens", 4))
    with Ledger(f"sqlite:///{db}") as ledger:
        rnd = a_round(ledger, data["cluster"]["name"], profile=profile.name, proposer="sweep")
        e = ledger.add_experiment(
            cluster=data["cluster"]["name"],
            round_id=rnd.id,
            kind=Kind.CANDIDATE,
            config=champion,
            champion_key=start.key,
            champion_objective=100.0,
            knob="num_speculative_tokens",
            value=4,
        )
        ledger.decide(
            e.id,
            verdict=VerdictRecord(status=Status.KEEP, rule="posterior", reason="r", stats={}),
            objective=110.0,
            delta_pct=10.0,
            accept_len=None,
            promote=True,
        )
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    again = orchestrate(tmp_path, "cluster", "up", "--dry-run", "--profile", str(path), env=env)
    assert again.returncode == 0, again.stderr
    line = _config_line(again.stdout)
    assert f"# config {champion.key} (the ledger's champion, experiment #{e.id})" in line
    head = again.stdout[again.stdout.index("# node-0 ") :]
    assert '"num_speculative_tokens":4,' in head  # the speculative config the head would run
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before

    changed = orchestrate(
        tmp_path,
        "cluster",
        "up",
        "--dry-run",
        "--set",
        "cuda_graphs=true",
        "--profile",
        str(path),
        env=env,
    )
    assert changed.returncode == 0, changed.stderr
    with_set = champion.apply(profile.space.change(champion, "cuda_graphs", True))
    assert (
        f"# config {with_set.key} (the ledger's champion, experiment #{e.id} with --set)"
        in _config_line(changed.stdout)
    )


def test_a_dry_run_reads_an_old_ledger_without_upgrading_it(tmp_path: Path) -> None:
    """A ledger written by the first release: the dry run reads its champion through an
    upgraded copy elsewhere (what ``cluster up`` would deploy after upgrading it) and leaves
    the file as it was, with no copy aside; ``Ledger(read_only=True)`` refuses it, saying the
    next command that writes upgrades it, and a missing file is not created."""
    db = tmp_path / "orchestrate.db"
    shutil.copyfile(LEDGERS / "schema1.sqlite", db)
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    data = twin_profile_data()
    data["cluster"]["name"] = "twin-local"  # the cluster the old release recorded
    path = write_profile(tmp_path, data)
    env = {**os.environ, "ORCHESTRATE_LEDGER": f"sqlite:///{db}"}
    done = orchestrate(tmp_path, "cluster", "up", "--dry-run", "--profile", str(path), env=env)
    assert done.returncode == 0, done.stderr
    old = json.loads((LEDGERS / "schema1.status.json").read_text())["champion"]
    line = _config_line(done.stdout)
    assert f"(the ledger's champion, experiment #{old['experiment']})" in line, line
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["orchestrate.db", "profile.yaml"]
    with pytest.raises(LedgerNotReady) as refused:
        Ledger(f"sqlite:///{db}", read_only=True)
    assert "is at schema 0001, older than this orchestrate's" in refused.value.message
    assert "the next command that writes to it upgrades it" in refused.value.message
    missing = tmp_path / "none.db"
    with pytest.raises(LedgerNotReady, match="no ledger yet"):
        Ledger(f"sqlite:///{missing}", read_only=True)
    assert not missing.exists()


def test_a_dry_run_reads_an_old_postgres_ledger_as_upgraded_and_leaves_it(
    tmp_path: Path, pg_url: str
) -> None:
    """The same on PostgreSQL, which cannot be copied aside: the ledger is upgraded inside a
    transaction that is rolled back, the champion read in between, and the database is left at
    the first release's schema."""
    _create_schema1(pg_url)
    _copy_fixture_rows(pg_url)
    data = twin_profile_data()
    data["cluster"]["name"] = "twin-local"
    path = write_profile(tmp_path, data)
    env = {**os.environ, "ORCHESTRATE_LEDGER": pg_url}
    done = orchestrate(tmp_path, "cluster", "up", "--dry-run", "--profile", str(path), env=env)
    assert done.returncode == 0, done.stderr
    old = json.loads((LEDGERS / "schema1.status.json").read_text())["champion"]
    line = _config_line(done.stdout)
    assert f"(the ledger's champion, experiment #{old['experiment']})" in line, line
    assert _version_rows(pg_url) == (None, 1)


def test_set_applies_its_changes_together_before_the_forbidden_combinations(
    tmp_path: Path,
) -> None:
    """Knobs an engine links (SGLang's draft tokens follow its steps) are declared as
    forbidden combinations: K 5 at MNBT 7168 is one, so K cannot move alone, and ``--set``
    moves both at once, checked on the result. One knob set twice is refused."""
    data = twin_profile_data()
    data["forbidden"] = [
        {
            "when": {"num_speculative_tokens": 5, "max_num_batched_tokens": 7168},
            "reason": "K 5 needs a larger batch",
        }
    ]
    path = write_profile(tmp_path, data)
    env = {**os.environ, "ORCHESTRATE_LEDGER": f"sqlite:///{tmp_path / 'orchestrate.db'}"}

    def dry(*sets: str) -> tuple[int, str, str]:
        args = [a for s in sets for a in ("--set", s)]
        done = orchestrate(
            tmp_path, "cluster", "up", "--dry-run", *args, "--profile", str(path), env=env
        )
        return done.returncode, done.stdout, done.stderr

    rc, _, err = dry("num_speculative_tokens=5")
    assert rc == 3 and err.strip().splitlines() == [
        "Error: forbidden combination num_speculative_tokens=5, max_num_batched_tokens=7168: "
        "K 5 needs a larger batch"
    ], err
    rc, out, err = dry("num_speculative_tokens=5", "max_num_batched_tokens=8192")
    assert rc == 0, err
    head = out[out.index("# node-0 ") :]
    assert '"num_speculative_tokens":5' in head and "8192" in head
    rc, _, err = dry("num_speculative_tokens=5", "num_speculative_tokens=6")
    assert rc == 2 and "--set num_speculative_tokens is given twice" in err, err
    assert not (tmp_path / "orchestrate.db").exists()


def test_set_of_a_misspelt_knob_names_the_knob_it_is_a_typo_of(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--set`` of a knob the profile lacks: one line, exit 3, naming the knob it is a typo
    of (the policy a profile's misspelt knob follows, ``knobs.names``) and the known ones."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ORCHESTRATE_LEDGER", f"sqlite:///{tmp_path / 'orchestrate.db'}")
    known = ", ".join(load_profile(None).space.names)
    argv = ["cluster", "up", "--dry-run", "--set"]
    assert run([*argv, "gpu_memory_utilisation=0.8"]) == 3
    assert capsys.readouterr().err.strip().splitlines() == [
        "Error: --set gpu_memory_utilisation=0.8: unknown knob 'gpu_memory_utilisation'; did "
        "you mean gpu_memory_utilization? "
        f"(known knobs: {known})"
    ]
    assert run([*argv, "speed=11"]) == 3  # nothing close: the known ones alone
    assert capsys.readouterr().err.strip().splitlines() == [
        f"Error: --set speed=11: unknown knob 'speed'; known knobs: {known}"
    ]
    assert not (tmp_path / "orchestrate.db").exists()
