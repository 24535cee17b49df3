"""A node's file system that answers the claim with words ``cluster.workdir`` does not know
(an I/O error, a stale NFS handle) is the node's: the node's own words, never a traceback,
never a claim said lost nor the config blamed. Over the real sshd test hosts, with a real
fake ``mkdir`` or ``cat`` first on node 1's PATH that fails as a failing disk or NFS mount
fails, for the claim's files only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ledger import Ledger
from tests.fixtures.cli import orchestrate
from tests.fixtures.profiles import write_profile
from tests.fixtures.sshd import SshCluster
from tests.test_workdir_refused import env_for, errors

#: A ``cmd`` that fails, as the kernel's errno says it, on the claim's files while ``@ON@``
#: exists, and is the real one otherwise.
FAILING = r"""#!/bin/bash
if [ -e @ON@ ]; then
  for a in "$@"; do
    case "$a" in *.orchestrate-claim*)
      echo "@CMD@: @VERB@ '$a': @WORDS@" >&2; exit 1;;
    esac
  done
fi
exec /bin/@CMD@ "$@"
"""


def _failing(cluster: SshCluster, tmp_path: Path, cmd: str, verb: str, words: str) -> Path:
    """``cmd`` on node 1 failing with ``words`` from now on; the file whose removal heals it."""
    on = tmp_path / f"{cmd}-fails"
    on.write_text("")
    fake = cluster.node(1).bin / cmd
    script = FAILING.replace("@ON@", str(on)).replace("@CMD@", cmd)
    fake.write_text(script.replace("@VERB@", verb).replace("@WORDS@", words))
    fake.chmod(0o755)
    return on


def _profile(cluster: SshCluster, tmp_path: Path) -> str:
    data: dict[str, Any] = cluster.profile_data()
    data["cells"] = data["cells"][:1]
    data["gates"].pop("clocks_command", None)
    data["gates"].pop("recover_command", None)
    data["verdict"] = {"policy": "threshold", "infra_retries": 1, "infra_backoff_s": 0.2}
    return str(write_profile(tmp_path, data))


def test_a_claim_made_on_an_io_error_is_the_nodes_with_its_words(
    ssh_cluster: SshCluster, tmp_path: Path
) -> None:
    """``mkdir`` of the claim answers EIO: the round stops before anything ran, exit 5, the
    node's own words, to run again once the node is back (not exit 6 as the setup's)."""
    profile = _profile(ssh_cluster, tmp_path)
    _failing(ssh_cluster, tmp_path, "mkdir", "cannot create directory", "Input/output error")
    done = orchestrate(tmp_path, "round", "--budget", "1", "-p", profile, env=env_for(tmp_path))
    assert done.returncode == 5, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    [line] = errors(done.stderr)
    assert line.startswith(f"Error: node 1 ({ssh_cluster.node(1).address}): "), line
    assert "cannot create directory" in line and "Input/output error" in line, line
    assert line.endswith("run the same command again once the node is back"), line
    with Ledger(env_for(tmp_path)["ORCHESTRATE_LEDGER"]) as ledger:
        assert ledger.experiments() == []
    assert ssh_cluster.engines() == {}


def test_a_claim_whose_id_a_stale_nfs_handle_hides_is_not_lost(
    ssh_cluster: SshCluster, tmp_path: Path
) -> None:
    """The claim's ``id`` cannot be read as it is renewed (``Stale file handle``): this was
    read as no claim there, and the round stopped with exit 8, "lost its claim on the node
    (its claim is gone)". It is the node's file system: said once with its words, and the
    round goes on to its end."""
    profile = _profile(ssh_cluster, tmp_path)
    env = {**env_for(tmp_path), "ORCHESTRATE_LEASE_TTL_S": "3"}
    _failing(ssh_cluster, tmp_path, "cat", "cannot open", "Stale file handle")
    done = orchestrate(tmp_path, "round", "--budget", "1", "-p", profile, env=env)
    said = done.stdout + done.stderr
    assert done.returncode == 0, said[-3000:]
    assert "Traceback" not in said and "lost its claim" not in said, said[-3000:]
    node = ssh_cluster.node(1)
    note = f"node-1 ({node.address}): its claim could not be renewed: cat: cannot open '"
    assert note in done.stdout, done.stdout
    assert "Stale file handle; the node's file system, not the config" in done.stdout
    assert done.stdout.count(note) == 1, done.stdout
    with Ledger(env["ORCHESTRATE_LEDGER"]) as ledger:
        assert all(e.decided_at is not None for e in ledger.experiments())
        assert len(ledger.experiments()) == 2
