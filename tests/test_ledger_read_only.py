"""A SQLite ledger whose filesystem goes read-only under a round (ext4's ``errors=remount-ro``
after a disk error; an operator's ``mount -o remount,ro``): said for what it is, at once, and
nothing the ledger recorded is lost. The filesystem is real: a small tmpfs in a mount namespace
of the test's own, made read-only under the open ledger by a read-only bind mount of itself
(a remount of the tmpfs itself is refused while SQLite holds its file open for writing; the
kernel's own remount on an error is not), and writable again when that mount is taken off."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from tests.fixtures.mounts import in_tmpfs

#: In a tmpfs: a ledger and a round; the filesystem read-only; a write; writable again; a write.
_GOES_READ_ONLY = """
import json, os, subprocess
from ledger import Ledger, LedgerError
here = os.getcwd()
said = {}
def create(cluster):
    ledger.create_round(cluster=cluster, profile_name="p", profile_digest="d", budget=1,
                        proposer="optuna", approve="auto", seed=0)
with Ledger("sqlite:///" + os.path.join(here, "orchestrate.db")) as ledger:
    create("before")
    subprocess.run(["mount", "--bind", here, here], check=True)
    subprocess.run(["mount", "-o", "remount,bind,ro", here], check=True)
    try:
        create("during")
    except LedgerError as e:
        said = {"unreachable": e.unreachable, "message": e.message,
                "read_only": getattr(e, "read_only", None)}
    subprocess.run(["umount", here], check=True)
    create("after")
    said["probes"] = [p for p in os.listdir(here) if p.startswith(".orchestrate-probe")]
    said["kept"] = [c for c in ("before", "during", "after") if ledger.unfinished_round(c)]
print(json.dumps(said))
"""


def test_a_ledger_whose_filesystem_goes_read_only_is_said_so_at_once_and_loses_nothing(
    tmp_path: Path,
) -> None:
    """SQLite said only "unable to open database file" (its journal could not be created), read
    as a ledger away for now: the round waited half an hour for a filesystem that does not
    come back by itself, then ended in SQLite's words. It is now one line, at once (not waited
    for): what (the filesystem went read-only), where (its mount point, the ledger's folder),
    what to do (remount it, or move the ledger), and that the same command resumes."""
    disk = tmp_path / "disk"
    done = in_tmpfs(disk, sys.executable, "-c", _GOES_READ_ONLY, env={**os.environ})
    assert done.returncode == 0, done.stderr[-3000:]
    said = json.loads(done.stdout)
    assert said["unreachable"] is False, said
    assert said["read_only"] is True, said
    message = said["message"]
    assert f"the filesystem at {disk} went read-only" in message, message
    assert f"mount -o remount,rw {disk}" in message, message
    assert "ORCHESTRATE_LEDGER" in message, message
    assert "resumes the round from the last step the ledger recorded" in message, message
    assert said["kept"] == ["before", "after"], said
    assert said["probes"] == [], said  # the file that asked the filesystem, removed
