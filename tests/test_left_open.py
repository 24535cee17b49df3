"""A stop for want of boots an earlier release recorded ``discard`` while it left the change
open for another look reads ``inconclusive`` wherever a person reads the record
(``orchestrator.left_open``): results.tsv, the report, ``experiments show``. The ledger keeps
what that release wrote. On a ledger the release at ec2db7a wrote (``schema6.sqlite``): its
experiment 5, K 7 → 6, +1.57 % over one boot, stopped by the futility rule while its posterior
still promised a look ("not worth another boot in this look"); experiment 4, a discard by the
posterior ("not worth a change"), stays ``discard``."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from knobs.vocabulary import Status
from ledger import Ledger
from orchestrator import left_open
from orchestrator.profile import load_profile
from orchestrator.report.data import collect
from tests.fixtures.cli import orchestrate

LEDGERS = Path(__file__).parent / "fixtures" / "ledgers"


def test_an_earlier_release_s_open_futility_stop_reads_inconclusive_and_its_record_is_kept(
    tmp_path: Path,
) -> None:
    """Before, results.tsv read `10363.50 +1.57 … discard num_speculative_tokens 6`, and
    `experiments show 5` `discard: objective 10363.5`: the value read as barred, while the
    search (which reads the verdict's rule and posterior) gives it another look."""
    shutil.copyfile(LEDGERS / "schema6.sqlite", tmp_path / "orchestrate.db")
    shutil.copyfile(LEDGERS / "schema6.profile.yaml", tmp_path / "profile.yaml")
    url = f"sqlite:///{tmp_path}/orchestrate.db"
    env = {**os.environ, "ORCHESTRATE_LEDGER": url}

    done = orchestrate(tmp_path, "export", "-p", "profile.yaml", "-", env=env)
    assert done.returncode == 0, done.stderr
    rows = {int(r.split("\t")[0]): r.split("\t") for r in done.stdout.splitlines()[1:]}
    assert rows[5][4] == "inconclusive", rows[5]
    assert rows[5][7] == f"num_speculative_tokens 7 → 6 (optuna); {left_open.WORDS}", rows[5]
    assert rows[4][4] == "discard" and rows[4][7] == "kv_cache_dtype fp8_e4m3 → fp8_e5m2 (optuna)"
    # the changes' other rows are the release's own export's, and row 5 but its status and
    # description
    old = {
        int(r.split("\t")[0]): r.split("\t")
        for r in (LEDGERS / "schema6.results.tsv").read_text().splitlines()[1:]
    }
    assert [rows[i] for i in (2, 3, 4)] == [old[i] for i in (2, 3, 4)]
    assert rows[5][:4] + rows[5][5:7] == old[5][:4] + old[5][5:7] and old[5][4] == "discard"

    shown = orchestrate(
        tmp_path, "experiments", "show", "5", "--json", "-p", "profile.yaml", env=env
    )
    assert shown.returncode == 0, shown.stderr
    view = json.loads(shown.stdout)
    assert (view["status"], view["recorded_status"]) == ("inconclusive", "discard")
    assert view["description"].endswith(left_open.WORDS) and view["verdict"]["rule"] == "futility"
    text = orchestrate(tmp_path, "experiments", "show", "5", "-p", "profile.yaml", env=env)
    assert text.returncode == 0, text.stderr
    assert "inconclusive: objective 10363.5 (+1.57% vs its champion)" in text.stdout, text.stdout
    assert "discard:" not in text.stdout

    profile = load_profile(str(tmp_path / "profile.yaml"))
    with Ledger(url) as ledger:
        points = {p.experiment: p for p in collect(profile, ledger).points}
        # nothing rewritten: the ledger keeps what the release wrote
        recorded = {e.id: e.status for e in ledger.experiments(cluster=profile.cluster.name)}
        verdict = ledger.verdict(5)
    assert points[5].status == Status.INCONCLUSIVE and points[5].label.endswith(left_open.WORDS)
    assert points[4].status == Status.DISCARD
    assert recorded[5] == Status.DISCARD and recorded[4] == Status.DISCARD
    assert verdict is not None and verdict.status == Status.DISCARD


def test_a_record_that_says_it_was_left_open_reads_so_without_a_posterior(tmp_path: Path) -> None:
    """Which records are read so: a futility discard whose record says it was left open (the
    words releases wrote from 17204be), or without those words one whose posterior still
    promises a look by today's rule; not a discard by the posterior, nor one past all promise
    (no posterior recorded, no words)."""
    shutil.copyfile(LEDGERS / "schema6.sqlite", tmp_path / "orchestrate.db")
    spec = load_profile(str(LEDGERS / "schema6.profile.yaml")).verdict
    with Ledger(f"sqlite:///{tmp_path}/orchestrate.db") as ledger:
        e, verdict = ledger.experiment(5), ledger.verdict(5)
        posterior = ledger.verdict(4)
    assert verdict is not None and posterior is not None
    assert left_open.left_open(spec, e, verdict)  # its posterior still promises a look
    bare = verdict.model_copy(
        update={"stats": {k: v for k, v in verdict.stats.items() if not k.startswith("post_")}}
    )
    assert not left_open.left_open(spec, e, bare)
    said = e.model_copy(
        update={
            "description": f"{e.description}; stopped for want of boots, open for a second "
            "look (it still promises +1.2%)"
        }
    )
    assert left_open.left_open(spec, said, bare)
    # a discard by the posterior ("not worth a change"), a keep: as recorded
    assert not left_open.left_open(spec, said, posterior)
    assert not left_open.left_open(spec, said.model_copy(update={"status": Status.KEEP}), verdict)
