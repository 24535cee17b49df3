"""A profile is recorded as its file writes it, not as where it was loaded from resolved it.

Loading resolves a local node's relative workdir against the folder it runs from, ``port:
auto`` to a pair of free ports (kept in the head's workdir) and the brief's path against the
profile's folder. The profile's digest and its revision's settings were of those resolved
values: the same file copied to another folder, or its ports picked anew, read as `the profile
changed`. None of them is what a measurement depends on (the launchers' digest leaves the
folders and ports out), so the record keeps them as written; a record an earlier release made
of them resolved reads the same where they resolve as then.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ledger import Ledger
from orchestrator import revision
from orchestrator.profile import load_profile
from tests.fixtures.profiles import twin_profile_data, write_profile
from tests.test_migrations import CLUSTER, _upgraded_release
from tests.test_profile_upgrade import release_profile, round_under


def written(nodes: list[str]) -> dict[str, Any]:
    """The twin profile with relative workdirs ``nodes``, ``port: auto`` and a relative
    brief (the file beside the profile)."""
    data = twin_profile_data(nodes=len(nodes))
    data["cluster"] = {
        "name": CLUSTER,
        "port": "auto",
        "nodes": [{"rank": r, "host": "127.0.0.1", "workdir": w} for r, w in enumerate(nodes)],
    }
    data["proposer"] = {"kind": "optuna", "seed": 0, "claude": {"brief": "brief.md"}}
    return data


def folder(path: Path) -> Path:
    path.mkdir()
    (path / "brief.md").write_text("tune the twin\n")
    return path


def test_the_same_profile_file_in_another_folder_is_the_same_profile(tmp_path: Path) -> None:
    """One ledger, the same profile file run from two folders. Before, the second round said
    `the profile changed since twin-local last ran (twin-test): cluster.nodes changed;
    proposer.claude.brief changed` (and the ports, picked anew in the new folder). Now it says
    nothing; a workdir edited in the file is still a change."""
    data = written(["nodes/node-0", "nodes/node-1"])
    url = f"sqlite:///{tmp_path / 'orchestrate.db'}"
    round_under(folder(tmp_path / "a"), url, data)
    shown = round_under(folder(tmp_path / "b"), url, data)
    assert "the profile changed" not in shown, shown
    edited = written(["nodes/node-0", "elsewhere/node-1"])
    shown = round_under(tmp_path / "b", url, edited)
    assert "(twin-test): cluster.nodes changed" in shown, shown


def test_ports_picked_anew_are_the_same_profile(tmp_path: Path) -> None:
    """``port: auto`` takes the pair kept in the head's workdir; another pair (the file gone,
    a port taken) is the same profile, its digest and settings unchanged. A port written as a
    number and edited is a change."""
    path = write_profile(folder(tmp_path / "a"), written(["n0", "n1"]))
    kept = tmp_path / "a" / "n0" / "cluster.ports"
    kept.parent.mkdir()
    kept.write_text("30000 30001\n")
    first = load_profile(str(path), base_dir=path.parent)
    kept.write_text("30010 30011\n")
    again = load_profile(str(path), base_dir=path.parent)
    assert (first.cluster.port, again.cluster.port) == (30000, 30010)  # resolved, as they run
    assert first.digest == again.digest
    assert revision.Revision.of(first).settings == revision.Revision.of(again).settings
    fixed = written(["n0", "n1"])
    fixed["cluster"].update(port=30000, master_port=30001)
    before = load_profile(str(write_profile(path.parent, fixed, "f.yaml")), base_dir=path.parent)
    fixed["cluster"]["port"] = 30002
    after = load_profile(str(write_profile(path.parent, fixed, "f.yaml")), base_dir=path.parent)
    old, new = revision.Revision.of(before), revision.Revision.of(after)
    said = revision.said(old, new, (old.name, old.digest))
    assert said == "(twin-test): cluster.port 30000 → 30002", said


def test_a_record_of_the_workdirs_resolved_reads_the_same_where_they_resolve_as_then(
    tmp_path: Path,
) -> None:
    """The releases before this one recorded the workdirs as resolved (``schema9s.sqlite``:
    ``/tmp/fx9/.orchestrate/twin/node-N``). The profile written with them relative, loaded from
    ``/tmp``, is the profile they recorded; loaded from another folder, it is not."""
    for release in ("schema9s", "schema9"):
        (tmp_path / release).mkdir()
        url, _ = _upgraded_release(release, tmp_path / release)
        data = release_profile()
        for node in data["cluster"]["nodes"]:
            node["workdir"] = node["workdir"].removeprefix("/tmp/")
        path = write_profile(tmp_path / release, data)
        with Ledger(url) as ledger:
            last = revision.last(ledger, CLUSTER)
        assert last is not None
        here = revision.Revision.of(load_profile(str(path), base_dir=Path("/tmp")))
        assert revision.said(last, here, (last.name, last.digest)) is None, release
        there = revision.Revision.of(load_profile(str(path), base_dir=tmp_path))
        assert "cluster" in str(revision.said(last, there, (last.name, last.digest))), release
