"""A node's workdir that its file system refuses: said at once as the setup's (the node, the
path, why, what to do; exit 6), by ``cluster check`` and by a round's claim, never waited for
as a node away; and a check leaves no folder it made. Over four real sshd test hosts, and on
the twin's local nodes in a folder with a real read-only or full file system mounted on it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ledger import Ledger
from tests.fixtures.cli import ORCHESTRATE, orchestrate
from tests.fixtures.mounts import in_tmpfs
from tests.fixtures.profiles import write_profile
from tests.fixtures.sshd import SshCluster


def env_for(directory: Path) -> dict[str, str]:
    """An orchestrate process whose ledger and MLflow live in ``directory``."""
    return {
        **os.environ,
        "ORCHESTRATE_LEDGER": f"sqlite:///{directory}/orchestrate.db",
        "MLFLOW_TRACKING_URI": f"sqlite:///{directory}/mlflow.db",
        "ORCHESTRATE_ARTIFACTS": str(directory / "mlartifacts"),
        "COLUMNS": "400",
    }


def errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("Error:")]


def under_a_file(cluster: SshCluster, tmp_path: Path, rank: int) -> tuple[dict[str, Any], Path]:
    """The hosts' profile with node ``rank``'s workdir under a regular file; that file.

    No clocks query: a real one (nvidia-smi) never touches the workdir, the twin's does."""
    data: dict[str, Any] = cluster.profile_data()
    data["cells"] = data["cells"][:1]
    data["gates"].pop("clocks_command", None)
    data["gates"].pop("recover_command", None)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    data["cluster"]["nodes"][rank]["workdir"] = str(blocker / "work")
    return data, blocker


def refusal(cluster: SshCluster, rank: int, blocker: Path) -> str:
    node = cluster.node(rank)
    return (
        f"Error: node-{rank} ({node.address}): its workdir {blocker}/work cannot be written (a "
        f"regular file is in its path: mkdir: cannot create directory '{blocker}': Not a "
        "directory), and the claim and the engine's files go there; waiting will not fix it: "
        "move that file aside on the node, or point the node's workdir (the profile's "
        f"cluster.nodes entry of rank {rank}; a relative one is under the folder the command "
        "runs in) at a writable folder"
    )


def test_cluster_check_fails_a_node_whose_workdir_cannot_be_written(
    ssh_cluster: SshCluster, tmp_path: Path
) -> None:
    data, blocker = under_a_file(ssh_cluster, tmp_path, 2)
    fresh = tmp_path / "fresh" / "node-3"
    data["cluster"]["nodes"][3]["workdir"] = str(fresh)
    profile = str(write_profile(tmp_path, data))
    env = env_for(tmp_path)
    check = orchestrate(tmp_path, "cluster", "check", "--profile", profile, env=env)
    assert check.returncode == 6, check.stdout + check.stderr
    assert errors(check.stderr) == [refusal(ssh_cluster, 2, blocker)], check.stderr
    assert "node(s) ready" not in check.stdout
    # every other node was checked over its own connection, and said so
    assert f"node-3: workdir {fresh} can be written" in check.stdout, check.stdout
    assert f"node-0: workdir {ssh_cluster.node(0).workdir} can be written" in check.stdout
    # the check changes nothing: the folders it made to write in are gone again
    assert not (tmp_path / "fresh").exists()
    # the file moved aside, the node passes, and its workdir is still not there
    blocker.unlink()
    again = orchestrate(tmp_path, "cluster", "check", "--profile", profile, env=env)
    assert again.returncode == 0, again.stderr
    assert "4 node(s) ready" in again.stdout
    assert f"node-2: workdir {blocker}/work can be written" in again.stdout
    assert not blocker.exists() and not (tmp_path / "fresh").exists()


def test_a_claim_refused_by_a_nodes_file_system_is_said_at_once_not_waited_for(
    ssh_cluster: SshCluster, tmp_path: Path
) -> None:
    """A workdir under a regular file is the setup's: the round stops as it claims the node,
    exit 6, with what to do, and not as a node away to wait for (exit 5)."""
    data, blocker = under_a_file(ssh_cluster, tmp_path, 1)
    data["verdict"] = {"policy": "threshold", "infra_retries": 1, "infra_backoff_s": 0.2}
    profile = str(write_profile(tmp_path, data))
    done = orchestrate(
        tmp_path, "round", "--budget", "1", "--profile", profile, env=env_for(tmp_path)
    )
    assert done.returncode == 6, done.stderr[-3000:]
    assert errors(done.stderr) == [refusal(ssh_cluster, 1, blocker)], done.stderr[-3000:]
    assert "once the node is back" not in done.stderr
    # nothing ran: no experiment, no engine, no claim left on the nodes that were claimed
    with Ledger(env_for(tmp_path)["ORCHESTRATE_LEDGER"]) as ledger:
        assert ledger.experiments() == []
    assert ssh_cluster.engines() == {}
    assert not (ssh_cluster.node(0).workdir / ".orchestrate-claim").exists()


def test_cluster_check_in_a_read_only_folder_says_so(tmp_path: Path) -> None:
    """The twin's nodes' workdirs are under the folder the command runs in."""
    folder = tmp_path / "ro"
    done = in_tmpfs(folder, *ORCHESTRATE, "cluster", "check", env=env_for(tmp_path), read_only=True)
    assert done.returncode == 6, done.stdout + done.stderr[-2000:]
    [said] = errors(done.stderr)
    assert said.startswith(
        f"Error: node-0 (127.0.0.1): its workdir {folder}/.orchestrate/twin/node-0 cannot be "
        "written (a read-only file system: mkdir: cannot create directory "
        f"'{folder}/.orchestrate': Read-only file system)"
    ), said
    assert "waiting will not fix it: make the folder writable on the node" in said, said


def test_a_claim_on_a_full_disk_is_said_at_once_not_waited_for(tmp_path: Path) -> None:
    """A disk with no room for the claim is the node's setup to fix: exit 6, with what to do,
    not exit 5 and a wait for the node to come back."""
    folder = tmp_path / "full"
    env = env_for(tmp_path)
    done = in_tmpfs(folder, *ORCHESTRATE, "round", "--budget", "1", env=env, full=True)
    assert done.returncode == 6, done.stderr[-2000:]
    [said] = errors(done.stderr)
    assert said.startswith(
        f"Error: node-0 (127.0.0.1): its workdir {folder}/.orchestrate/twin/node-0 cannot be "
        "written (the node's disk is full: mkdir: cannot create directory "
        f"'{folder}/.orchestrate': No space left on device)"
    ), said
    assert "waiting will not fix it: free space on the node's disk, or point" in said, said
    assert "once the node is back" not in done.stderr
    with Ledger(env["ORCHESTRATE_LEDGER"]) as ledger:
        assert ledger.experiments() == []
